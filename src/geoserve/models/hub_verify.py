"""What geoserve checks of a Hub endpoint's answers, and of the Hub cache, before using them.

huggingface_hub builds cache paths from what the endpoint answers: ``blobs/<ETag>``,
``snapshots/<X-Repo-Commit>/FILE``, ``.no_exist/<X-Repo-Commit>/FILE``, and ``refs/REVISION``
holding the commit, without checking that the ETag and the commit are hashes. An endpoint
(``HF_ENDPOINT`` names any server: a mirror, a proxy, a hostile host) answering
``ETag: "../../x"`` would have it write that file outside the cache. So, while geoserve fetches,
every response of huggingface_hub's HTTP client is checked before huggingface_hub acts on it
(:func:`checked_responses`): an ``X-Repo-Commit`` that is not 40 hex digits, or a file's ETag
(``X-Linked-Etag``, else ``ETag``) or ``X-Xet-Hash`` that is not a sha1 or sha256, stops the
fetch with a :class:`WeightsError`, before anything is written.

Whatever the cache holds is checked again before it is used: :func:`cached_commit` refuses a
``refs/REVISION`` file that does not hold a commit hash, and :func:`verify_cached_file` refuses a
file that is not a link in ``models--ORG--REPO/snapshots/<commit>/`` to the repository's own
``blobs/<hash>``, or whose bytes do not hash to ``<hash>``. No file is loaded unverified.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from geoserve.errors import WeightsError

COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")

#: The reference being fetched in this thread (or task); None: no geoserve fetch.
_FETCHING: ContextVar[str | None] = ContextVar("geoserve_hub_fetching", default=None)


def is_commit(text: str) -> bool:
    """Whether ``text`` is a full Git commit hash (40 lower-case hex digits)."""
    return COMMIT.fullmatch(text) is not None


def is_content_hash(text: str) -> bool:
    """Whether ``text`` names a blob by content: a Git blob id (sha1) or a sha256."""
    return COMMIT.fullmatch(text) is not None or SHA256.fullmatch(text) is not None


def repo_cache_dir(cache: Path, org: str, repo: str) -> Path:
    """``<cache>/models--ORG--REPO``, the cache resolved as huggingface_hub resolves it."""
    return cache.expanduser().resolve() / f"models--{org}--{repo}"


# -- the endpoint's answers ---------------------------------------------------------------------


@contextmanager
def checked_responses(ref: object, session: Any) -> Iterator[None]:
    """Check every response ``session`` (huggingface_hub's client) receives while in the block.

    The check is a response hook on the client, installed once and active only inside this
    block (in this thread or task); it raises :class:`WeightsError` naming ``ref``.
    """
    hooks = session.event_hooks["response"]
    if _check_response not in hooks:
        hooks.append(_check_response)
    token = _FETCHING.set(str(ref))
    try:
        yield
    finally:
        _FETCHING.reset(token)


def _check_response(response: Any) -> None:
    ref = _FETCHING.get()
    if ref is None:
        return
    headers = response.headers
    commit = headers.get("X-Repo-Commit")
    if commit is not None and not is_commit(commit):
        raise _refused(ref, response, "X-Repo-Commit", commit, "a commit hash (40 hex digits)")
    xet = headers.get("X-Xet-Hash")
    if xet is not None and not SHA256.fullmatch(xet):
        raise _refused(ref, response, "X-Xet-Hash", xet, "a sha256 (64 hex digits)")
    if response.request.method == "HEAD" and response.status_code < 400 and commit is not None:
        # a file's metadata: huggingface_hub names the blob by this, as it normalizes it
        name = "X-Linked-Etag" if headers.get("X-Linked-Etag") else "ETag"
        etag = headers.get(name)
        if etag is not None and not is_content_hash(etag.lstrip("W/").strip('"')):
            raise _refused(ref, response, name, etag, "a content hash (40 or 64 hex digits)")


def _refused(ref: str, response: Any, header: str, value: str, expected: str) -> WeightsError:
    url = response.request.url
    where = f"{url.scheme}://{url.host}{f':{url.port}' if url.port else ''}"
    return WeightsError(
        f"{ref}: {where} answered {header} {shown(value)} for "
        f"{shown(str(url.path))}, not {expected}; refused before anything was written. "
        "HF_ENDPOINT must name the Hugging Face Hub or a faithful mirror of it"
    )


# -- the cache ----------------------------------------------------------------------------------


def cached_commit(repo_dir: Path, revision: str | None, ref: object) -> str | None:
    """The commit ``revision`` names: itself if a commit hash, else what ``refs/`` records.

    None: the cache records nothing for it.

    Raises:
        WeightsError: the ``refs`` file cannot be read, or holds something else than a commit
            hash (it would be used as a directory name).
    """
    rev = revision or "main"
    if is_commit(rev):
        return rev
    path = repo_dir / "refs" / rev
    try:
        text = path.read_text(encoding="ascii")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{ref}: cannot read the cache's {path}: {exc}") from None
    commit = text.strip()
    if not is_commit(commit):
        raise WeightsError(
            f"{ref}: the cache's {path} holds {shown(commit)}, not a commit hash (40 hex "
            f"digits); delete {repo_dir} and fetch the reference again"
        )
    return commit


def verify_cached_file(path: Path, ref: object, repo_dir: Path) -> None:
    """Check ``path`` is the repository's blob named by its hash, and hash its bytes again.

    ``path`` must lie in ``repo_dir/snapshots/<commit>/`` and be a link that resolves to the
    same file as ``repo_dir/blobs/<hash>`` (the sha256 of its content for files stored with Git
    LFS, the Git blob id, the sha1 of ``blob <size>``, a NUL byte and the content, for the
    others), and the content must hash to ``<hash>``.

    Raises:
        WeightsError: any of it does not hold (naming the file and what to do), or the file
            cannot be read.
    """
    fix = f"delete {repo_dir} and fetch it again"
    link = Path(os.path.abspath(path))
    snapshots = repo_dir / "snapshots"
    parts = link.relative_to(snapshots).parts if link.is_relative_to(snapshots) else ()
    if len(parts) < 2 or not is_commit(parts[0]):
        raise WeightsError(
            f"{ref}: the cached file {path} is not in a snapshot of the repository "
            f"({snapshots}/<commit>/); {fix}"
        )
    if not link.is_symlink():
        raise WeightsError(
            f"{ref}: the cached file {path} is a plain file, not a link to a blob named by its "
            "hash, so it cannot be verified (a cache written without symbolic links, or "
            f"altered); {fix} on a file system with symbolic links, or give the weights as a "
            "local path"
        )
    try:
        name = Path(os.readlink(link)).name
        blob = repo_dir / "blobs" / name
        same = is_content_hash(name) and blob.is_file() and os.path.samefile(link, blob)
    except OSError:
        same = False
    if not same:
        raise WeightsError(
            f"{ref}: the cached file {path} links to {shown(os.path.realpath(link))}, not to a "
            f"blob of the repository named by its hash ({repo_dir / 'blobs'}/<hash>); {fix}"
        )
    try:
        digest = (
            hashlib.sha256()
            if len(name) == 64
            else hashlib.sha1(b"blob %d\0" % blob.stat().st_size)
        )
        with blob.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise WeightsError(f"{ref}: cannot read the cached file {blob}: {exc}") from None
    if digest.hexdigest() != name:
        raise WeightsError(
            f"{ref}: the cached file {path} is corrupt (its content hashes to "
            f"{digest.hexdigest()[:16]}..., the cache expects {name[:16]}...); {fix}"
        )


def shown(text: str) -> str:
    """Untrusted text quoted for a message, cut short."""
    return repr(text if len(text) <= 120 else text[:117] + "...")
