"""Weights by Hub reference (``hf://ORG/REPO[/FILE][@REVISION]``), fully offline.

Every test runs against a cache directory filled by hand in huggingface_hub's own layout
(tests/hub_cache.py); nothing reaches the network: offline tests set ``HF_HUB_OFFLINE``, and
the few that take the online path replace huggingface_hub's network calls.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import torch
from huggingface_hub import errors as hub_errors

from geoserve import Engine, EngineConfig
from geoserve.errors import ConfigError, WeightsError
from geoserve.models.hub import (
    HubReference,
    check_weights_value,
    parse_reference,
    resolve_weights,
)
from tests.hub_cache import (
    COMMIT,
    FILE,
    OLD_COMMIT,
    ORG,
    REF,
    REPO,
    add_file,
    fill_cache,
    offline,
    repo_dir,
    seg_weights,
    set_ref,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    fill_cache(cache)
    offline(monkeypatch, cache)
    return cache


def bias_of(weights: str | Path) -> list[float]:
    return Engine("test-seg", weights=weights, warmup=False).model.conv.bias.tolist()


# -- references --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("hf://org/repo", HubReference("org", "repo")),
        ("hf://org/repo/w.pt", HubReference("org", "repo", "w.pt")),
        (
            "hf://Org_1/re.po-2/sub/dir/w.safetensors@v1.0",
            HubReference("Org_1", "re.po-2", "sub/dir/w.safetensors", "v1.0"),
        ),
        (f"hf://org/repo@{COMMIT}", HubReference("org", "repo", None, COMMIT)),
        ("hf://org/repo/w.ckpt@refs/pr/3", HubReference("org", "repo", "w.ckpt", "refs/pr/3")),
        ("HF://org/repo", HubReference("org", "repo")),
    ],
)
def test_references_parse(text, parsed):
    assert parse_reference(text) == parsed
    assert parse_reference(str(parsed)) == parsed  # str() writes it back
    assert check_weights_value(text) == text  # a reference stays text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("hf://../x", "bad organisation name '..'"),
        ("hf://org", "no REPO"),
        ("hf://org/", "an empty part"),
        ("hf://org/repo/../../etc/passwd", "'..'"),
        ("hf://org/repo//etc/passwd", "an empty part"),
        ("hf://org/repo/./w.pt", "'.' parts"),
        ("hf://org/repo/a\\b", "a backslash"),
        ("hf://org/repo/.hidden", "bad file name '.hidden'"),
        ("hf://org/repo/w pt", "bad file name 'w pt'"),
        ("hf://org--x/repo", "bad organisation name 'org--x'"),
        ("hf://org/re%2fpo", "bad repository name"),
        ("hf://org/repo@", "bad revision ''"),
        ("hf://org/repo@../../refs", "bad revision '../../refs'"),
        ("hf://org/repo/w.pt@v1@v2", "bad revision 'v1@v2'"),
        ("hf://org/repo/" + "a/" * 20 + "w.pt", "16 folders deep"),
        ("hf://org/repo/" + "w" * 600, "longer than 512 characters"),
    ],
)
def test_bad_references_are_refused_naming_them(text, why):
    with pytest.raises(ConfigError) as info:
        parse_reference(text)
    message = str(info.value)
    assert why in message
    assert repr(text if len(text) <= 120 else text[:117] + "...") in message
    with pytest.raises(ConfigError, match=r"^weights: Hub reference"):
        EngineConfig.build(weights=text)
    with pytest.raises(ConfigError):
        resolve_weights(text)


@pytest.mark.parametrize("text", ["s3://bucket/w.pt", "http://host/w.pt", "file:///w.pt"])
def test_other_schemes_are_refused(text):
    scheme = text.split(":")[0]
    with pytest.raises(ConfigError, match=f"{scheme}:// is not fetched") as info:
        EngineConfig.build(weights=text)
    assert repr(text) in str(info.value)
    with pytest.raises(ConfigError, match="a local file or a Hub reference"):
        resolve_weights(text)


def test_a_plain_path_stays_a_path(tmp_path):
    assert resolve_weights(None) is None
    local = tmp_path / "w.pt"
    assert resolve_weights(local) is local
    assert resolve_weights("w.pt") == Path("w.pt")
    assert resolve_weights("C:/w.pt") == Path("C:/w.pt")  # a drive letter is no scheme
    assert EngineConfig(weights="sub/w.pt").weights == Path("sub/w.pt")
    assert EngineConfig(weights=REF).weights == REF


# -- resolving from the cache ------------------------------------------------------------------


def test_a_reference_resolves_to_the_snapshot_file_with_its_config_beside(cache):
    path = resolve_weights(REF)
    assert path == repo_dir(cache.resolve()) / "snapshots" / COMMIT / FILE
    assert path.is_symlink()
    assert (path.parent / "config.json").is_file()  # what a loader reads beside it
    assert path.read_bytes() == seg_weights(3.0)


def test_a_file_in_a_folder_takes_the_config_of_its_folder(cache):
    add_file(cache, "sub/dir/w.safetensors", seg_weights(4.0), repo="nested")
    add_file(cache, "sub/dir/config.yaml", b"model_args: {}\n", lfs=False, repo="nested")
    add_file(cache, "config.json", b"{}\n", lfs=False, repo="nested")  # another folder's
    set_ref(cache, "main", COMMIT, repo="nested")
    path = resolve_weights(f"hf://{ORG}/nested/sub/dir/w.safetensors")
    assert (
        path
        == repo_dir(cache.resolve(), repo="nested") / "snapshots" / COMMIT / "sub/dir/w.safetensors"
    )
    assert bias_of(f"hf://{ORG}/nested") == [4.0] * 4  # the only weights file, in a folder


def test_engine_with_a_reference_equals_the_same_local_file(cache, tmp_path, make_geotiff):
    local = tmp_path / "local.safetensors"
    shutil.copyfile(repo_dir(cache) / "snapshots" / COMMIT / FILE, local)
    scene = make_geotiff(bands=3, height=37, width=45)
    outputs = []
    for weights in (REF, local, None):
        engine = Engine("test-seg", weights=weights, output_kind="probabilities")
        outputs.append(engine.generate_image(scene, out_format="tensor").outputs.tensor)
        engine.close()
    by_hub, by_file, default = outputs
    assert torch.equal(by_hub, by_file)
    assert not torch.allclose(by_hub, default)  # the weights were loaded, not the defaults


@pytest.mark.parametrize(
    ("revision", "bias"),
    [
        ("", 3.0),
        ("@main", 3.0),
        ("@v2", 3.0),
        ("@v1", -2.0),
        (f"@{OLD_COMMIT}", -2.0),
        (f"@{COMMIT}", 3.0),
    ],
)
def test_a_revision_selects_the_commit(cache, revision, bias):
    assert bias_of(REF + revision) == [bias] * 4
    path = resolve_weights(REF + revision)
    assert path is not None
    assert path.parent.name == (OLD_COMMIT if bias < 0 else COMMIT)


def test_without_a_file_the_one_weights_file_is_taken(cache):
    assert bias_of(f"hf://{ORG}/{REPO}") == [3.0] * 4  # README.md and config.json are no weights
    assert bias_of(f"hf://{ORG}/{REPO}@v1") == [-2.0] * 4
    # safetensors is preferred over a pickle
    add_file(cache, "older.pt", b"not read", repo="mixed")
    add_file(cache, "w.safetensors", seg_weights(5.0), repo="mixed")
    set_ref(cache, "main", COMMIT, repo="mixed")
    assert bias_of(f"hf://{ORG}/mixed") == [5.0] * 4


def test_several_or_no_weights_files_are_named(cache):
    for name in ("a.safetensors", "b.safetensors", "c.pt"):
        add_file(cache, name, seg_weights(1.0), repo="two")
    set_ref(cache, "main", COMMIT, repo="two")
    with pytest.raises(
        WeightsError,
        match=r"2 weights files in the repository \(a\.safetensors, "
        r"b\.safetensors\); name one: hf://geo-org/two/a\.safetensors",
    ):
        resolve_weights(f"hf://{ORG}/two")
    add_file(cache, "notes.txt", b"x", repo="none", lfs=False)
    set_ref(cache, "main", COMMIT, repo="none")
    with pytest.raises(WeightsError, match=r"hf://geo-org/none: no weights file .*notes\.txt"):
        resolve_weights(f"hf://{ORG}/none")


# -- failures ----------------------------------------------------------------------------------


def test_offline_and_not_cached_says_what_to_do(cache):
    with pytest.raises(WeightsError) as info:
        resolve_weights(f"hf://{ORG}/{REPO}/missing.safetensors@v1")
    message = str(info.value)
    assert message.startswith(f"hf://{ORG}/{REPO}/missing.safetensors@v1: not in the cache at ")
    assert str(cache) in message
    assert "HF_HUB_OFFLINE is set" in message
    assert f"`hf download {ORG}/{REPO} missing.safetensors --revision v1`" in message
    with pytest.raises(WeightsError, match="HF_HUB_OFFLINE is set"):
        Engine("test-seg", weights=f"hf://{ORG}/elsewhere/w.safetensors")
    with pytest.raises(
        WeightsError,
        match=r"hf://geo-org/elsewhere: not in the cache at .* `hf "
        r"download geo-org/elsewhere`",
    ):
        resolve_weights(f"hf://{ORG}/elsewhere")  # no file named: nothing to list either
    with pytest.raises(WeightsError, match="not in the cache"):
        resolve_weights(f"{REF}@v9")  # an unknown ref


def test_a_corrupt_blob_is_refused(cache):
    blob = (repo_dir(cache) / "snapshots" / COMMIT / FILE).resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # one bit pattern changed, same size
    blob.write_bytes(bytes(data))
    with pytest.raises(WeightsError) as info:
        Engine("test-seg", weights=REF)
    message = str(info.value)
    assert message.startswith(f"{REF}: the cached file ")
    assert "is corrupt" in message
    assert f"delete {repo_dir(cache)} and fetch it again" in message
    assert bias_of(f"{REF}@v1") == [-2.0] * 4  # another commit's blob is still fine


def test_a_corrupt_config_beside_it_is_refused_too(cache):
    config = (repo_dir(cache) / "snapshots" / COMMIT / "config.json").resolve()
    config.write_bytes(b'{"note": "changed"}\n')  # a small (non-LFS) file: its git blob id
    with pytest.raises(WeightsError, match="is corrupt"):
        resolve_weights(REF)


def _copy_in_place(link: Path, tmp: Path) -> None:  # as where symlinks are not supported
    data = link.read_bytes()
    link.unlink()
    link.write_bytes(data)


def _link_outside_the_cache(link: Path, tmp: Path) -> None:
    outside = tmp / "elsewhere" / FILE
    outside.parent.mkdir()
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(outside)


def _link_to_a_blobs_folder_elsewhere(link: Path, tmp: Path) -> None:
    # named by its right hash, in a folder called blobs: but not the repository's
    name = link.resolve().name
    outside = tmp / "other" / "blobs" / name
    outside.parent.mkdir(parents=True)
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(os.path.relpath(outside, link.parent))


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        (_copy_in_place, "is a plain file, not a link to a blob named by its hash"),
        (_link_outside_the_cache, "not to a blob of the repository named by its hash"),
        (_link_to_a_blobs_folder_elsewhere, "not to a blob of the repository named by its hash"),
    ],
)
def test_a_cached_file_that_is_not_the_repositorys_verified_blob_is_never_loaded(
    cache, tmp_path, tamper, why
):
    link = repo_dir(cache) / "snapshots" / COMMIT / FILE
    tamper(link, tmp_path)
    with pytest.raises(WeightsError) as info:
        Engine("test-seg", weights=REF, warmup=False)
    message = str(info.value)
    assert message.startswith(f"{REF}: the cached file {link} ")
    assert why in message
    assert f"delete {repo_dir(cache)} and fetch it again" in message
    assert bias_of(f"{REF}@v1") == [-2.0] * 4  # another commit's file is still fine


@pytest.mark.parametrize("recorded", [f"{COMMIT}/../{OLD_COMMIT}", "../../../elsewhere", "main"])
def test_a_branch_the_cache_records_must_name_a_commit_hash(cache, recorded):
    set_ref(cache, "main", recorded)
    with pytest.raises(WeightsError) as info:
        bias_of(REF)  # huggingface_hub would take it as a directory name
    refs = repo_dir(cache) / "refs" / "main"
    assert str(info.value) == (
        f"{REF}: the cache's {refs} holds {recorded!r}, not a commit hash (40 hex digits); "
        f"delete {repo_dir(cache)} and fetch the reference again"
    )
    with pytest.raises(WeightsError, match="not a commit hash"):
        resolve_weights(f"hf://{ORG}/{REPO}")  # the listing from the cache, too
    assert bias_of(f"{REF}@v1") == [-2.0] * 4  # another branch is still fine


# -- the online path, its network calls replaced -----------------------------------------------


@pytest.fixture
def online(cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return cache


def _fail_with(monkeypatch, exc):
    def download(*args, **kwargs):
        raise exc

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)


def _http(cls, message="HTTP error"):
    return cls(message, response=SimpleNamespace(headers={}, request=None))


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        (
            _http(hub_errors.GatedRepoError),
            f"a gated repository: accept its terms at huggingface.co/{ORG}/{REPO} and log in",
        ),
        (_http(hub_errors.RepositoryNotFoundError), "no such repository on the hub"),
        (_http(hub_errors.RevisionNotFoundError), "the repository has no revision 'main'"),
        (_http(hub_errors.RemoteEntryNotFoundError), f"the repository has no file '{FILE}'"),
        (hub_errors.LocalEntryNotFoundError("no connection"), "not in the cache at"),
        (ConnectionError("proxy refused"), "cannot fetch it (ConnectionError: proxy refused)"),
    ],
)
def test_hub_errors_become_weights_errors(online, monkeypatch, exc, why):
    _fail_with(monkeypatch, exc)
    with pytest.raises(WeightsError) as info:
        Engine("test-seg", weights=REF)
    assert str(info.value).startswith(f"{REF}: ")
    assert why in str(info.value)


def test_a_cached_commit_is_read_without_asking_the_hub(online, monkeypatch):
    # what huggingface_hub records when the repository has no config.yaml at that commit
    marker = repo_dir(online) / ".no_exist" / COMMIT / "config.yaml"
    marker.parent.mkdir(parents=True)
    marker.touch()

    def no_network(**kwargs):
        raise AssertionError(f"the hub was asked for {kwargs['filename']}")

    monkeypatch.setattr(huggingface_hub.file_download, "_get_metadata_or_catch_error", no_network)
    assert bias_of(f"{REF}@{COMMIT}") == [3.0] * 4
    with pytest.raises(WeightsError, match=f"the hub was asked for {FILE}"):
        resolve_weights(REF)  # a branch: its commit is asked for (online)


def test_online_without_a_connection_the_file_list_comes_from_the_cache(online, monkeypatch):
    listed, fetched = [], []

    def no_network(self, repo_id, **kwargs):
        listed.append(repo_id)
        raise ConnectionError("no route to host")

    def from_cache(repo_id, filename, *, revision, **kwargs):  # hf_hub_download's own fallback
        fetched.append((filename, revision))
        path = repo_dir(online) / "snapshots" / COMMIT / filename
        if not path.exists():
            raise hub_errors.LocalEntryNotFoundError(f"{filename} is not cached")
        return str(path)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", from_cache)
    assert bias_of(f"hf://{ORG}/{REPO}") == [3.0] * 4
    assert listed == [f"{ORG}/{REPO}"]
    # the weights by the reference's revision; the config beside them at the commit they came
    # from: config.json from the cache, config.yaml (not cached) asked for, and skipped
    assert fetched == [(FILE, None), ("config.yaml", COMMIT)]


def test_a_config_is_looked_for_in_the_weights_folder(online, monkeypatch):
    add_file(online, "sub/w.safetensors", seg_weights(4.0), repo="nested")
    set_ref(online, "main", COMMIT, repo="nested")
    fetched = []

    def from_cache(repo_id, filename, *, revision, **kwargs):
        fetched.append(filename)
        path = repo_dir(online, repo="nested") / "snapshots" / COMMIT / filename
        if not path.exists():
            raise hub_errors.RemoteEntryNotFoundError(
                "404", response=SimpleNamespace(headers={}, request=None)
            )
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", from_cache)
    assert bias_of(f"hf://{ORG}/nested/sub/w.safetensors") == [4.0] * 4
    assert fetched == ["sub/w.safetensors", "sub/config.json", "sub/config.yaml"]
