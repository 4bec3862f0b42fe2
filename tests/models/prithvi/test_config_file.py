"""load_checkpoint(config=FILE): a config file as well as a mapping, read as untrusted input."""

from __future__ import annotations

import json

import pytest
import torch

from geoserve.errors import ConfigError, GeoServeError, WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.prithvi import PrithviSegmentation
from geoserve.models.prithvi.config import MAX_CONFIG_BYTES
from tests.models.prithvi.test_checkpoint import SMALL, save_lightning


def small_segmentation() -> PrithviSegmentation:
    """Depth 12, so the decoder's feature indices need no config (TerraTorch's for depth 12)."""
    torch.manual_seed(0)
    args = {**SMALL, "depth": 12}
    return PrithviSegmentation(
        num_classes=2, feature_indices=(2, 5, 8, 11), decoder_channels=32, **args
    ).eval()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "finetune.ckpt"
    save_lightning(small_segmentation(), path)
    return path


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("config.yaml", "num_heads: 4\nfeature_indices: [2, 5, 8, 11]\n"),  # flat arguments
        ("arch.yml", "model_args:\n  num_heads: 4\n"),  # v1 layout
        ("hf.json", json.dumps({"pretrained_cfg": {"num_heads": 4, "patch_size": [1, 16, 16]}})),
        (
            "terratorch.yaml",
            "model:\n  init_args:\n    model_args:\n      backbone_num_frames: 1\n"
            "      num_classes: 2\n",
        ),
    ],
)
def test_config_file_path_is_read(tmp_path, ckpt, name, text):
    cfg = tmp_path / name
    cfg.write_text(text)
    for config in (str(cfg), cfg):
        model = load_checkpoint(ckpt, config=config)
        # the checkpoint's shapes alone give 1 head for width 64; the file's 4 must win
        if "terratorch" not in name:
            assert model.encoder.blocks[0].attn.num_heads == 4
        assert not model.training


def test_config_file_replaces_the_one_beside_the_checkpoint(tmp_path):
    ckpt = tmp_path / "w.ckpt"
    save_lightning(small_segmentation(), ckpt)
    (tmp_path / "config.json").write_text(json.dumps({"pretrained_cfg": {"num_heads": 8}}))
    mine = tmp_path / "mine.yaml"
    mine.write_text("num_heads: 4\n")
    assert load_checkpoint(ckpt).encoder.blocks[0].attn.num_heads == 8
    assert load_checkpoint(ckpt, config=mine).encoder.blocks[0].attn.num_heads == 4


@pytest.mark.parametrize("config", [42, ["config.yaml"], b"config.yaml"])
def test_other_config_types_are_refused(ckpt, config):
    with pytest.raises(ConfigError, match="mapping of architecture arguments or the path") as err:
        load_checkpoint(ckpt, config=config)
    assert isinstance(err.value, GeoServeError)
    assert type(config).__name__ in str(err.value)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.yaml", "num_heads: [4\n", "cannot parse config"),
        ("list.yaml", "- num_heads\n- 4\n", "config must be a mapping, got list"),
        ("empty.yaml", "", "config must be a mapping, got NoneType"),
        ("bad.json", "{num_heads: 4}", "cannot parse config"),
        ("latin1.yaml", b"num_heads: 4 # \xe9t\xe9\n", "cannot parse config"),
        ("nested.yaml", "model: 3\n", r"model is not a mapping"),
        ("ps.json", json.dumps({"model_args": {"patch_size": "16"}}), "patch_size must be"),
        ("nothing.yaml", "model:\n  init_args: {}\n", "no architecture arguments found"),
        ("config.txt", "num_heads: 4\n", "not a config file; expected .json, .yaml, .yml"),
        ("huge.yaml", "num_heads: 4\n" + "#" * MAX_CONFIG_BYTES, "config over 1 MB"),
        ("typo.yaml", "num_head: 4\n", r"config .*typo\.yaml does not fit the model"),
    ],
)
def test_malformed_config_files_name_the_file(tmp_path, ckpt, name, content, message):
    cfg = tmp_path / name
    if isinstance(content, bytes):
        cfg.write_bytes(content)
    else:
        cfg.write_text(content)
    with pytest.raises(WeightsError, match=message) as err:
        load_checkpoint(ckpt, config=cfg)
    assert name in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_config_file_is_named(tmp_path, ckpt):
    with pytest.raises(WeightsError, match=r"nope\.yaml: config file not found"):
        load_checkpoint(ckpt, config=tmp_path / "nope.yaml")


def test_yaml_is_read_safely(tmp_path, ckpt):
    marker = tmp_path / "pwned"
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(f'num_heads: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(WeightsError, match=r"evil\.yaml: cannot parse config"):
        load_checkpoint(ckpt, config=cfg)
    assert not marker.exists()


def test_malformed_config_beside_the_checkpoint_is_named(tmp_path):
    ckpt = tmp_path / "w.ckpt"
    save_lightning(small_segmentation(), ckpt)
    (tmp_path / "config.yaml").write_text("- just\n- a list\n")
    with pytest.raises(WeightsError, match=r"config\.yaml: config must be a mapping"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("embed_dim: 2000000\n", "embed_dim must be an integer from 1 to 8192, not 2000000"),
        ("depth: 3000\n", "depth must be an integer from 1 to 128, not 3000"),
        ("embed_dim: abc\n", "embed_dim must be an integer from 1 to 8192, not 'abc'"),
        ("num_heads: true\n", "num_heads must be an integer from 1 to 128, not True"),
        ("model_args:\n  depth: 0\n", "depth must be an integer from 1 to 128, not 0"),
    ],
)
def test_absurd_sizes_in_a_config_file_are_refused_before_anything_is_built(
    tmp_path, ckpt, text, message
):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(WeightsError, match=message) as info:
        load_checkpoint(ckpt, config=cfg)
    assert str(info.value).startswith(str(cfg))
