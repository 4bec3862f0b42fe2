"""Weights by reference: ``hf://ORG/REPO[/FILE][@REVISION]`` resolved to a local file.

A weights value is a local path or a Hugging Face Hub reference. A reference is parsed and
checked strictly (it is untrusted text: no ``..``, no absolute or backslashed file names, a
small character set, length caps), then fetched with ``huggingface_hub.hf_hub_download`` into
the Hub's own cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``), which a second run reads without a connection. With
``HF_HUB_OFFLINE=1`` nothing is fetched: the file must already be in the cache. Without FILE the
repository's one weights file is taken (``.safetensors`` first, then ``.pt``, ``.pth``,
``.ckpt``). A ``config.json`` or ``config.yaml`` beside the file in the repository is fetched
too, since some loaders read a config next to the checkpoint (the cache's snapshot directory
holds the repository's files side by side).

What the Hub endpoint answers is checked before huggingface_hub writes anything, and every
file is verified before it is used (:mod:`geoserve.models.hub_verify`): the cache names a
file's content by its hash (the sha256 for files stored with Git LFS, the Git blob id for small
ones), the file must be a link to the repository's blob of that name, and the bytes are hashed
again and compared, so a truncated, altered or misplaced cached file is refused rather than
loaded.

The environment variables are read when a reference is resolved (``huggingface_hub`` itself
reads them once, when it is first imported; ``HF_ENDPOINT`` is passed to it on each call).
Nothing here imports torch.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from geoserve.errors import ConfigError, WeightsError
from geoserve.models.hub_verify import (
    cached_commit,
    checked_responses,
    is_commit,
    repo_cache_dir,
    verify_cached_file,
)

if TYPE_CHECKING:
    from types import ModuleType

logger = logging.getLogger(__name__)

#: The scheme of a Hub reference.
HUB_SCHEME = "hf"
#: Suffixes of the weights files a repository's file is chosen from (the first preferred).
WEIGHTS_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt")
#: Config files fetched when one sits beside the weights file in the repository.
CONFIG_NAMES = ("config.json", "config.yaml")
#: Longest reference accepted, and longest file name within a repository.
MAX_REFERENCE = 512
MAX_FILE = 400

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")  # two letters at least: not C:/
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")  # an org or a repo
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}")  # one folder or file name
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubReference:
    """A parsed ``hf://ORG/REPO[/FILE][@REVISION]`` reference (see :func:`parse_reference`)."""

    org: str
    repo: str
    filename: str | None = None
    """The file's path in the repository (``/``-separated); None: the repository's one."""
    revision: str | None = None
    """A branch, tag or commit hash; None: ``main``."""

    @property
    def repo_id(self) -> str:
        """``ORG/REPO``, as huggingface_hub names a repository."""
        return f"{self.org}/{self.repo}"

    def __str__(self) -> str:
        file = f"/{self.filename}" if self.filename else ""
        rev = f"@{self.revision}" if self.revision else ""
        return f"{HUB_SCHEME}://{self.repo_id}{file}{rev}"


def scheme_of(text: str) -> str | None:
    """The URL scheme ``text`` starts with (lower case), or None for a plain path."""
    m = _SCHEME.match(text)
    return m.group(1).lower() if m else None


def is_hub_reference(value: object) -> bool:
    """Whether ``value`` is text that starts with ``hf://`` (checked or not)."""
    return isinstance(value, str) and scheme_of(value) == HUB_SCHEME


def parse_reference(text: str) -> HubReference:
    """Parse and check ``hf://ORG/REPO[/FILE][@REVISION]``.

    Raises:
        ConfigError: not a Hub reference, or a part of it is malformed (naming the reference
            and the part).
    """
    shown = f"Hub reference {_shown(text)}"
    if not is_hub_reference(text):
        raise ConfigError(f"not a Hub reference (hf://ORG/REPO[/FILE][@REVISION]): {_shown(text)}")
    if len(text) > MAX_REFERENCE:
        raise ConfigError(f"{shown}: longer than {MAX_REFERENCE} characters")
    if "\\" in text:
        raise ConfigError(f"{shown}: a backslash; parts of a Hub reference are separated by /")
    body = text.split("://", 1)[1]
    path, at, revision = body.partition("@")
    if at and not _is_revision(revision):
        raise ConfigError(
            f"{shown}: bad revision {revision!r} (a branch, tag or commit hash: letters, "
            "digits, '_', '.', '-', parts separated by /, no '..')"
        )
    parts = path.split("/")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"{shown}: expected hf://ORG/REPO[/FILE][@REVISION] (an empty part, or no REPO)"
        )
    org, repo, *file = parts
    for label, name in (("organisation", org), ("repository", repo)):
        if not _NAME.fullmatch(name) or ".." in name or "--" in name:
            raise ConfigError(
                f"{shown}: bad {label} name {name!r} (letters, digits, '_', '.', '-'; at most "
                "96 characters; no '..' or '--')"
            )
    if file:
        if ".." in file or "." in file:
            raise ConfigError(f"{shown}: the file name may not contain '..' or '.' parts")
        if len(file) > 16 or not all(_PART.fullmatch(p) for p in file):
            raise ConfigError(
                f"{shown}: bad file name {'/'.join(file)!r} (parts of letters, digits, '_', '.', "
                "'+', '=', '-', not starting with '.'; at most 16 folders deep)"
            )
    filename = "/".join(file) or None
    if filename and len(filename) > MAX_FILE:
        raise ConfigError(f"{shown}: the file name is longer than {MAX_FILE} characters")
    return HubReference(org, repo, filename, revision or None)


def check_weights_value(value: str) -> str | Path:
    """A weights setting as text: a checked ``hf://`` reference (kept as text), else a path.

    Raises:
        ConfigError: a malformed Hub reference, or another scheme (``http://``, ``s3://``).
    """
    scheme = scheme_of(value)
    if scheme is None:
        return Path(value)
    if scheme != HUB_SCHEME:
        raise ConfigError(
            f"URL {_shown(value)}: weights are a local file or a Hub reference "
            f"(hf://ORG/REPO[/FILE][@REVISION]); {scheme}:// is not fetched"
        )
    parse_reference(value)
    return value


def resolve_weights(
    weights: str | Path | None, *, cache_dir: str | Path | None = None
) -> Path | None:
    """The local file for a weights setting: a path as it is, a Hub reference fetched.

    Raises:
        ConfigError: a malformed reference, or a URL of another scheme.
        WeightsError: the reference cannot be fetched or its cached file is corrupt.
    """
    if weights is None or isinstance(weights, Path):
        return weights
    checked = check_weights_value(weights)
    if isinstance(checked, Path):
        return checked
    return fetch(parse_reference(checked), cache_dir=cache_dir)


# -- fetching -----------------------------------------------------------------------------------


def hub_cache_dir() -> Path:
    """The Hub cache now: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, as huggingface_hub reads them."""
    env = os.environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(os.path.expandvars(env[key])).expanduser()
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def fetch(ref: HubReference, *, cache_dir: str | Path | None = None) -> Path:
    """Fetch ``ref`` (and a config beside it) into the cache, verify it, return its path.

    The path is the file's link in the cache's snapshot directory, so a config fetched beside
    it lies in the same directory. While fetching, the endpoint's answers are checked before
    huggingface_hub writes anything, and each file is verified before it is returned
    (:mod:`geoserve.models.hub_verify`).

    Raises:
        WeightsError: not fetched (offline and not cached, no such repository, file or
            revision, a gated repository, no connection), the endpoint answered something that
            is not a hash, or the cached file is misplaced or corrupt.
    """
    hub = _import_hub(ref)
    cache = (Path(cache_dir) if cache_dir is not None else hub_cache_dir()).expanduser().resolve()
    offline = is_offline() or bool(hub.constants.HF_HUB_OFFLINE)
    filename = ref.filename or _checked_choice(
        choose_weights_file(_repo_files(hub, ref, cache, offline), ref), ref
    )
    ref = replace(ref, filename=filename)
    path = _download(hub, ref, filename, cache, offline)
    assert path is not None  # (not optional)
    repo_dir = repo_cache_dir(cache, ref.org, ref.repo)
    verify_cached_file(path, ref, repo_dir)
    for name in CONFIG_NAMES:
        config = _fetch_beside(hub, ref, path, name, cache, offline)
        if config is not None:
            verify_cached_file(config, ref, repo_dir)
    logger.info("%s: %s", ref, path)
    return path


def _fetch_beside(
    hub: ModuleType, ref: HubReference, path: Path, name: str, cache: Path, offline: bool
) -> Path | None:
    """The file ``name`` beside ``ref``'s in the repository, at the same commit; None: none.

    ``path`` is verified: it lies in ``snapshots/<commit>/``. The cache answers first (a file
    it holds, or one it recorded as absent): no connection.
    """
    assert ref.filename is not None
    beside = posixpath.join(posixpath.dirname(ref.filename), name)
    commit = path.parts[-(ref.filename.count("/") + 2)]  # the snapshot's directory
    assert is_commit(commit)
    cached = hub.try_to_load_from_cache(ref.repo_id, beside, cache_dir=cache, revision=commit)
    if isinstance(cached, str):
        return Path(cached)
    if cached is not None:  # huggingface_hub's mark of a file the repository lacks
        return None
    return _download(hub, replace(ref, revision=commit), beside, cache, offline, optional=True)


def choose_weights_file(files: list[str], ref: HubReference) -> str:
    """The repository's one weights file: ``.safetensors`` first, then ``.pt``/``.pth``/``.ckpt``.

    Raises:
        WeightsError: none, or several of the preferred kind (listing them).
    """
    weights = sorted(f for f in files if f.lower().endswith(WEIGHTS_SUFFIXES))
    safetensors = [f for f in weights if f.lower().endswith(".safetensors")]
    candidates = safetensors or weights
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        shown = ", ".join(sorted(files)[:10]) or "none"
        raise WeightsError(
            f"{ref}: no weights file ({', '.join(WEIGHTS_SUFFIXES)}) in the repository (its "
            f"files: {shown}); name one: hf://{ref.repo_id}/FILE"
        )
    listed = ", ".join(candidates[:10]) + (", ..." if len(candidates) > 10 else "")
    raise WeightsError(
        f"{ref}: {len(candidates)} weights files in the repository ({listed}); name one: "
        f"{replace(ref, filename=candidates[0])}"
    )


def _checked_choice(filename: str, ref: HubReference) -> str:
    """A file name the repository listed (untrusted), checked as a reference's FILE is."""
    try:
        parse_reference(f"{HUB_SCHEME}://{ref.repo_id}/{filename}")
    except ConfigError as exc:
        raise WeightsError(
            f"{ref}: the repository's weights file {_shown(filename)} is not a name geoserve "
            f"fetches ({exc}); name another file: hf://{ref.repo_id}/FILE"
        ) from None
    return filename


def _import_hub(ref: HubReference) -> ModuleType:
    try:
        import huggingface_hub
    except ImportError as exc:
        raise WeightsError(
            f"{ref}: Hub references need huggingface_hub (pip install huggingface_hub): {exc}"
        ) from None
    return huggingface_hub


def _download(
    hub: ModuleType,
    ref: HubReference,
    filename: str,
    cache: Path,
    offline: bool,
    *,
    optional: bool = False,
) -> Path | None:
    """``hf_hub_download`` into ``cache``; its errors as :class:`WeightsError`.

    The revision is checked first: a branch or tag the cache recorded must name a commit hash.
    Offline, the file is looked up by that commit; online, every answer of the endpoint is
    checked before huggingface_hub acts on it. An ``optional`` file that the repository lacks,
    or that is not cached while offline (or with no connection), is None.
    """
    from huggingface_hub import errors

    repo_dir = repo_cache_dir(cache, ref.org, ref.repo)
    commit = cached_commit(repo_dir, ref.revision, ref)  # before huggingface_hub reads it
    try:
        if offline:
            got = hub.hf_hub_download(
                ref.repo_id,
                filename,
                revision=commit or ref.revision,
                cache_dir=cache,
                local_files_only=True,
            )
        else:
            with checked_responses(ref, hub.get_session()):
                got = hub.hf_hub_download(
                    ref.repo_id,
                    filename,
                    revision=ref.revision,
                    cache_dir=cache,
                    endpoint=_endpoint(),
                )
    except WeightsError:
        raise
    except errors.EntryNotFoundError as exc:  # not in the repository, or offline not cached
        if optional:
            return None
        raise _hub_error(ref, exc, cache, offline) from None
    except Exception as exc:  # the hub client's, its HTTP library's or the file system's
        raise _hub_error(ref, exc, cache, offline) from None
    return Path(got)


def _repo_files(hub: ModuleType, ref: HubReference, cache: Path, offline: bool) -> list[str]:
    """The repository's files: from the hub, else (offline, or no connection) the cache's."""
    from huggingface_hub import errors

    if not offline:
        try:
            with checked_responses(ref, hub.get_session()):
                api = hub.HfApi(endpoint=_endpoint())
                files: list[str] = api.list_repo_files(ref.repo_id, revision=ref.revision)
            return files
        except WeightsError:
            raise
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as exc:
            raise _hub_error(ref, exc, cache, offline) from None
        except Exception as exc:  # no connection, the hub down: what the cache has
            logger.warning("%s: cannot list the repository (%s); using the cache", ref, exc)
    repo_dir = repo_cache_dir(cache, ref.org, ref.repo)
    commit = cached_commit(repo_dir, ref.revision, ref)
    snapshot = repo_dir / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        why = "HF_HUB_OFFLINE is set" if offline else f"{hub_endpoint()} cannot be reached"
        raise WeightsError(
            f"{ref}: not in the cache at {cache} and {why}; download it on a machine that can "
            f"reach huggingface.co with `hf download {ref.repo_id}{_rev_flag(ref)}` and copy "
            "the cache here"
        )
    return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]


def _hub_error(ref: HubReference, exc: Exception, cache: Path, offline: bool) -> WeightsError:
    """One line for a failed fetch: what went wrong and what to do."""
    from huggingface_hub import errors

    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    file = ref.filename or ""
    if isinstance(exc, errors.GatedRepoError):
        why = (
            f"a gated repository: accept its terms at huggingface.co/{ref.repo_id} and log in "
            "(`hf auth login`, or set HF_TOKEN)"
        )
    elif isinstance(exc, errors.RepositoryNotFoundError):
        why = "no such repository on the hub (a private one needs `hf auth login` or HF_TOKEN)"
    elif isinstance(exc, errors.RevisionNotFoundError):
        why = f"the repository has no revision {ref.revision or 'main'!r}"
    elif isinstance(exc, errors.LocalEntryNotFoundError) and offline:
        why = (
            f"not in the cache at {cache} and HF_HUB_OFFLINE is set; download it on a machine "
            f"that can reach huggingface.co with `hf download {ref.repo_id} {file}"
            f"{_rev_flag(ref)}` and copy the cache here (or unset HF_HUB_OFFLINE)"
        )
    elif isinstance(exc, errors.LocalEntryNotFoundError):
        why = f"not in the cache at {cache}, and {hub_endpoint()} cannot be reached ({detail})"
    elif isinstance(exc, errors.EntryNotFoundError):
        why = f"the repository has no file {file!r} at {ref.revision or 'main'}"
    else:
        why = f"cannot fetch it ({type(exc).__name__}: {detail})"
    return WeightsError(f"{ref}: {why}")


def _rev_flag(ref: HubReference) -> str:
    return f" --revision {ref.revision}" if ref.revision else ""


def hub_endpoint() -> str:
    """The Hub's address as huggingface_hub reaches it: ``HF_ENDPOINT``, else huggingface.co."""
    return _endpoint() or "huggingface.co"


def _endpoint() -> str | None:
    """``HF_ENDPOINT`` now (None: huggingface_hub's default), as huggingface_hub reads it."""
    return os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None


def _is_revision(text: str) -> bool:
    if not 0 < len(text) <= 128 or ".." in text:
        return False
    return all(_PART.fullmatch(p) for p in text.split("/"))


def _shown(text: str) -> str:
    """Untrusted text quoted for a message, cut short."""
    return repr(text if len(text) <= 120 else text[:117] + "...")
