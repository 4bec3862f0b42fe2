"""A Hugging Face Hub cache built by hand, in the layout huggingface_hub itself writes.

``<cache>/models--ORG--REPO/blobs/<etag>`` holds each file's bytes (the etag is the sha256
for a Git LFS file, the Git blob sha1 for a small one), ``snapshots/<commit>/<file>`` is a
relative link to its blob, and ``refs/<name>`` holds a commit hash (no newline, as
huggingface_hub writes it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from tests.stub_models import TinySeg

ORG, REPO = "geo-org", "tiny-seg"
COMMIT = "1" * 40
OLD_COMMIT = "2" * 40
FILE = "tiny.safetensors"
REF = f"hf://{ORG}/{REPO}/{FILE}"


def repo_dir(cache: Path, org: str = ORG, repo: str = REPO) -> Path:
    return cache / f"models--{org}--{repo}"


def add_file(
    cache: Path,
    name: str,
    data: bytes,
    *,
    commit: str = COMMIT,
    lfs: bool = True,
    org: str = ORG,
    repo: str = REPO,
) -> Path:
    """Put ``data`` in the cache as ``name`` at ``commit``; returns the snapshot link."""
    if lfs:
        etag = hashlib.sha256(data).hexdigest()
    else:
        etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    blob = repo_dir(cache, org, repo) / "blobs" / etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = repo_dir(cache, org, repo) / "snapshots" / commit / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    return link


def set_ref(cache: Path, name: str, commit: str, *, org: str = ORG, repo: str = REPO) -> None:
    path = repo_dir(cache, org, repo) / "refs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(commit)


def seg_weights(bias: float) -> bytes:
    """A state dict of ``test-seg`` whose bias is ``bias`` everywhere, as safetensors bytes."""
    model = TinySeg()
    with torch.no_grad():
        model.conv.bias.fill_(bias)
    return save(model.state_dict())


def offline(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """Point huggingface_hub at ``cache`` and switch the network off (read when resolving)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def fill_cache(cache: Path) -> None:
    """``ORG/REPO``: ``main`` and tag ``v2`` at COMMIT (bias 3), tag ``v1`` at OLD_COMMIT (bias
    -2); a small ``config.json`` (not LFS) beside the weights at COMMIT."""
    add_file(cache, FILE, seg_weights(3.0))
    add_file(cache, "config.json", b'{"note": "beside the weights"}\n', lfs=False)
    add_file(cache, "README.md", b"# tiny\n", lfs=False)
    add_file(cache, FILE, seg_weights(-2.0), commit=OLD_COMMIT)
    set_ref(cache, "main", COMMIT)
    set_ref(cache, "v2", COMMIT)
    set_ref(cache, "v1", OLD_COMMIT)
