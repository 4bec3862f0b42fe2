"""Weights fetched from a Hub endpoint (HF_ENDPOINT): a real HTTP server on 127.0.0.1.

The endpoint is tests/hub_server.py, honest unless a test makes it answer an ETag or a commit
that is not a hash, as a hostile mirror would: huggingface_hub would build cache paths from
them. Nothing may then be written, in the cache or outside it, and nothing loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants as hub_constants

from geoserve import Engine
from geoserve.errors import WeightsError
from geoserve.models.hub import resolve_weights
from tests.hub_cache import COMMIT, FILE, ORG, REF, REPO, repo_dir, seg_weights
from tests.hub_server import FakeHub, fake_hub

TOKEN = "hf_test_token_123"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with fake_hub({FILE: seg_weights(3.0), "config.json": b"{}\n"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        # what huggingface_hub would have read at import, had HF_ENDPOINT been set before
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(hub_constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        yield hub


def written(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def refusal(weights: str) -> str:
    """The WeightsError building an engine with ``weights`` raises ('' if none)."""
    try:
        Engine("test-seg", weights=weights, warmup=False)
    except WeightsError as exc:
        return str(exc)
    return ""


def bias_of(weights: str) -> list[float]:
    return Engine("test-seg", weights=weights, warmup=False).model.conv.bias.tolist()


def test_an_honest_endpoint_is_fetched_verified_and_sent_the_token(hub, tmp_path):
    assert bias_of(REF) == [3.0] * 4
    path = resolve_weights(REF)
    assert path == repo_dir((tmp_path / "hub").resolve()) / "snapshots" / COMMIT / FILE
    assert (path.parent / "config.json").is_file()
    assert bias_of(f"hf://{ORG}/{REPO}") == [3.0] * 4  # the file chosen from the listing
    asked = {(method, p) for method, p, _ in hub.requests}
    assert ("HEAD", f"/{ORG}/{REPO}/resolve/main/{FILE}") in asked
    assert ("GET", f"/api/models/{ORG}/{REPO}/tree/main") in asked
    # HF_TOKEN goes to whatever HF_ENDPOINT names (docs/models.md says so)
    ours = [auth for _, p, auth in hub.requests if p.startswith((f"/{ORG}/", "/api/models/"))]
    assert len(ours) >= 6
    assert set(ours) == {f"Bearer {TOKEN}"}


def test_a_path_traversal_etag_is_refused_before_anything_is_written(hub, tmp_path):
    hub.etags[FILE] = "../../../outside"  # blobs/<etag>: tmp_path/outside, beside the cache
    message = refusal(REF)
    assert not (tmp_path / "outside").exists()
    assert written(tmp_path) == []  # nothing in the cache either
    assert message.startswith(f"{REF}: {hub.url} answered ETag '\"../../../outside\"' for ")
    assert "not a content hash (40 or 64 hex digits); refused before anything was written" in (
        message
    )
    assert "HF_ENDPOINT must name the Hugging Face Hub" in message
    assert [m for m, _, _ in hub.requests] == ["HEAD"]  # not downloaded
    # the check is geoserve's, while it fetches: huggingface_hub called directly is unchanged
    url = huggingface_hub.hf_hub_url(f"{ORG}/{REPO}", FILE)
    assert huggingface_hub.get_hf_file_metadata(url).etag == "../../../outside"


def test_a_dropped_connection_fails_the_fetch_cleanly_and_writes_nothing(hub, tmp_path):
    """A hostile endpoint that drops the metadata request, then would answer a path-traversal
    ETag: the fetch fails with the cause named, and nothing is written anywhere."""
    hub.drop = 1
    hub.etags[FILE] = "../../../outside"
    message = refusal(REF)
    assert not (tmp_path / "outside").exists()
    assert written(tmp_path) == []
    assert message.startswith(f"{REF}: cannot fetch it (RemoteProtocolError")


@pytest.mark.parametrize(
    ("commit", "weights", "escape"),
    [
        ("not-a-commit", REF, None),  # would become snapshots/not-a-commit/
        # a missing file's 404: huggingface_hub would record it as .no_exist/<commit>/FILE
        ("../../../outside", f"hf://{ORG}/{REPO}/missing.safetensors", "outside"),
    ],
)
def test_a_commit_that_is_not_a_hash_is_refused(hub, tmp_path, commit, weights, escape):
    hub.commit = commit
    message = refusal(weights)
    if escape:
        assert not (tmp_path / escape).exists()
    assert written(tmp_path) == []
    assert message.startswith(f"{weights}: {hub.url} answered X-Repo-Commit {commit!r} for ")
    assert "not a commit hash (40 hex digits); refused before anything was written" in message


def test_a_listed_weights_file_is_checked_as_a_reference_is(hub, tmp_path):
    hub.files = {"../../escaped.safetensors": seg_weights(3.0)}  # the listing is the hub's word
    message = refusal(f"hf://{ORG}/{REPO}")
    assert message.startswith(
        f"hf://{ORG}/{REPO}: the repository's weights file '../../escaped.safetensors' is not a "
        "name geoserve fetches ("
    )
    assert written(tmp_path) == []
    assert not any("resolve" in p for _, p, _ in hub.requests)  # not asked for
