"""TerraMind checkpoint layouts: bare encoder keys, Lightning encoder + config, fine-tunes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from geoserve.errors import WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.terramind import TerraMindEncoder, TerraMindSegmentation
from geoserve.models.terramind import checkpoint as tm_checkpoint
from geoserve.models.terramind.variants import VARIANTS
from tests.models.terramind.test_plugin import NECKS, save_lightning, tiny_finetune

TINY = VARIANTS["terramind_v1_tiny"]


def _encoder(mods: dict[str, int], seed: int = 0) -> TerraMindEncoder:
    torch.manual_seed(seed)
    enc = TerraMindEncoder(mods, **TINY).eval()
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.05)
    return enc


def _write_config(path: Path, **model_args: object) -> Path:
    return _write_args(path, model_args)


def _write_args(path: Path, model_args: dict) -> Path:
    cfg = {"model": {"init_args": {"model_factory": "EncoderDecoderFactory"}}}
    cfg["model"]["init_args"]["model_args"] = model_args  # type: ignore[index]
    path.write_text(yaml.safe_dump(cfg))
    return path


def _same(a: torch.nn.Module, b: torch.nn.Module, x: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        fa, fb = a(x), b(x)
    for u, v in zip(fa, fb, strict=True):
        assert torch.equal(u, v)


def test_bare_encoder_keys_without_config(tmp_path: Path) -> None:
    """Variant and modalities from the shapes; pretraining-only parts are dropped."""
    enc = _encoder({"S2L2A": 12, "S1GRD": 2})
    state = dict(enc.state_dict())
    state["decoder.0.attn.qkv.weight"] = torch.zeros(3, 3)  # the pretraining decoder
    state["decoder_embeddings.tok_sen2l2a@224.mod_emb"] = torch.zeros(1, 1, 192)
    state["encoder_embeddings.tok_lulc@224.token_emb.weight"] = torch.zeros(10, 192)
    path = tmp_path / "TerraMind_v1_tiny.pt"
    torch.save(state, path)
    model = load_checkpoint(path)
    assert isinstance(model, TerraMindEncoder)
    assert model.modalities == ["S2L2A", "S1GRD"]
    x = {"S2L2A": torch.randn(1, 12, 64, 64), "S1GRD": torch.randn(1, 2, 64, 64)}
    _same(enc, model, x)


def test_gated_bias_free_shapes_are_read_off_the_weights(tmp_path: Path) -> None:
    """A base-style block layout (gated MLP, no biases) with a tiny width is still recognised."""
    enc = TerraMindEncoder({"DEM": 1}, dim=192, depth=2, num_heads=3, gated_mlp=True, bias=False)
    path = tmp_path / "enc.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in enc.state_dict().items()}, str(path))
    model = load_checkpoint(path)
    assert isinstance(model, TerraMindEncoder)
    assert len(model.encoder) == 2
    assert model.encoder[0].mlp.fc3 is not None
    assert model.encoder[0].attn.qkv.bias is None
    _same(enc.eval(), model, {"DEM": torch.randn(1, 1, 32, 48)})


def test_lightning_encoder_with_a_backbone_only_config(tmp_path: Path) -> None:
    """model.encoder.* keys beside a config naming the backbone and its modalities."""
    enc = _encoder({"S2L1C": 13, "S1GRD": 2}, seed=3)
    state = {f"model.encoder.{k}": v for k, v in enc.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 1}, tmp_path / "enc.ckpt")
    _write_config(
        tmp_path / "config.yaml",
        backbone="terramind_v1_tiny",
        backbone_modalities=["S1GRD", "S2L1C"],
    )
    model = load_checkpoint(tmp_path / "enc.ckpt")
    assert isinstance(model, TerraMindEncoder)
    assert model.modalities == ["S1GRD", "S2L1C"]  # the config's names and order
    x = {"S2L1C": torch.randn(1, 13, 32, 32), "S1GRD": torch.randn(1, 2, 32, 32)}
    with torch.no_grad():
        for u, v in zip(enc(x), model(x), strict=True):
            assert float((u - v).abs().max()) < 1e-5  # the mean over two modalities: any order


def test_finetune_without_config_is_read_off_the_keys(tmp_path: Path) -> None:
    """UNet channels, the pyramid neck, classes and head from the shapes; default indices."""
    necks = [
        {"name": "SelectIndices", "indices": [2, 5, 8, 11]},
        {"name": "ReshapeTokensToImage"},
        {"name": "LearnedInterpolateToPyramidal"},
    ]
    torch.manual_seed(0)
    enc = dict(modalities={"S2L2A": 12}, **TINY)
    model = TerraMindSegmentation(
        enc,
        necks=necks,
        decoder="UNetDecoder",
        decoder_args={"channels": [64, 32, 16, 8]},
        num_classes=3,
        head_args={"channel_list": [8]},
    ).eval()
    torch.save(
        {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
        tmp_path / "m.ckpt",
    )
    loaded = load_checkpoint(tmp_path / "m.ckpt")
    assert isinstance(loaded, TerraMindSegmentation)
    assert loaded.num_classes == 3
    assert loaded.decoder_kind == "UNetDecoder"
    x = torch.randn(1, 12, 96, 80)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))  # a bare tensor is the only modality


def test_mismatches_name_the_keys_and_the_file(tmp_path: Path) -> None:
    enc = _encoder({"S2L2A": 12})
    state = dict(enc.state_dict())
    del state["encoder.3.attn.proj.weight"]
    torch.save(state, tmp_path / "cut.pt")
    with pytest.raises(
        WeightsError, match=r"cut\.pt.*missing \['encoder\.3\.attn\.proj\.weight'\]"
    ):
        load_checkpoint(tmp_path / "cut.pt")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"backbone": "terramind_v1_huge"}, "backbone must be one of"),
        (
            {"backbone": "terramind_v1_tiny", "backbone_modalities": ["LULC"]},
            "LULC needs TerraMind's tokenizer",
        ),
        (
            {"backbone": "terramind_v1_tiny", "backbone_modalities": ["SAR9"]},
            "unknown TerraMind modality 'SAR9'",
        ),
        ({"backbone": "terramind_v1_tiny", "decoder": "ASPPHead"}, "decoder must be"),
        ({"backbone": "terramind_v1_tiny", "backbone_dim": 64}, "does not take backbone_dim"),
        ({"backbone": "terramind_v1_tiny", "num_classes": 10**9}, "num_classes must be"),
        (
            {"backbone": "terramind_v1_tiny", "backbone_modalities": ["S2L2A"]}
            | {"backbone_bands": {"s2l2a": ["BLUE", "GREEN"]}},
            "backbone_bands names 's2l2a', which is not one of backbone_modalities",
        ),
        ({"backbone": "terramind_v1_tiny", 7: 1}, "model_args: key '7' is not a name"),
        (
            {"backbone": "terramind_v1_tiny", "num_classes": 2, "decoder": "UperNetDecoder"}
            | {"necks": [{"name": "SelectIndices", "indices": [2, 5, 8, 99]}]},
            "does not fit .list index out of range",
        ),
        (
            {"backbone": "terramind_v1_tiny", "num_classes": 2, "decoder": "UperNetDecoder"}
            | {"necks": [*NECKS[:2], {"name": "InterpolateToPyramidal", "scale_factor": 100}]},
            r"InterpolateToPyramidal: 100 over 4 levels .* at most 64",
        ),
        (
            {"backbone": "terramind_v1_tiny", "num_classes": 2, "decoder": "UperNetDecoder"}
            | {"necks": [*NECKS[1:2], {"name": "InterpolateToPyramidal"}]},  # 12 layers: 2**12
            r"InterpolateToPyramidal: 2 over 12 levels",
        ),
        (
            {"backbone": "terramind_v1_tiny", "num_classes": 2, "decoder": "UperNetDecoder"}
            | {"necks": [*NECKS[:2], {"name": "InterpolateToPyramidal", "mode": "linear"}]},
            r"InterpolateToPyramidal: mode 'linear' is not one of",
        ),
        (
            {"backbone": "terramind_v1_tiny", "num_classes": 2, "decoder": "UperNetDecoder"}
            | {"necks": [*NECKS[:2], {"name": "MaxpoolToPyramidal", "kernel_size": 2.5}]},
            r"MaxpoolToPyramidal: the scale must be a positive integer",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(tmp_path: Path, args: dict, message: str) -> None:
    torch.save(_encoder({"S2L2A": 12}).state_dict(), tmp_path / "w.pt")
    cfg = _write_args(tmp_path / "cfg.yaml", args)
    with pytest.raises(WeightsError, match=message):
        load_checkpoint(tmp_path / "w.pt", config=cfg)


def test_config_modality_missing_from_the_weights(tmp_path: Path) -> None:
    torch.save(_encoder({"S2L2A": 12}).state_dict(), tmp_path / "w.pt")
    cfg = _write_config(
        tmp_path / "cfg.yaml", backbone="terramind_v1_tiny", backbone_modalities=["S2L1C"]
    )
    with pytest.raises(WeightsError, match=r"no patch embedding for modalities \['S2L1C'\]"):
        load_checkpoint(tmp_path / "w.pt", config=cfg)


def test_config_sizes_cost_no_memory_before_the_weights_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config's decoder sizes are checked against the weights on the meta device first.

    (Built for real, 8192-channel UNet blocks took 17 GB before the shapes were compared.)
    """
    weights = save_lightning(tiny_finetune({"S2L1C": 6}), tmp_path / "tm.ckpt")
    cfg = _write_config(
        tmp_path / "cfg.yaml",
        backbone="terramind_v1_tiny",
        backbone_modalities=["S2L1C"],
        necks=NECKS,
        decoder="UNetDecoder",
        decoder_channels=[8192, 8192, 8192, 8192],
        num_classes=2,
    )
    built: list[bool] = []
    build = tm_checkpoint._build

    def spy(*args: object) -> torch.nn.Module:
        model = build(*args)  # type: ignore[arg-type]
        built.append(next(model.parameters()).is_meta)
        return model

    monkeypatch.setattr(tm_checkpoint, "_build", spy)
    with pytest.raises(WeightsError, match=r"shape mismatch at decoder\.decoder\.blocks\.0"):
        load_checkpoint(weights, config=cfg)
    assert built == [True]  # only the empty model was built


@pytest.mark.parametrize("name", ["config.yaml", "config.json"])
def test_a_prithvi_config_beside_a_terramind_checkpoint(tmp_path: Path, name: str) -> None:
    """The checkpoint's keys decide when the config beside it is not a TerraTorch one."""
    model = tiny_finetune({"S2L1C": 6})
    weights = save_lightning(model, tmp_path / "tm.ckpt")
    (tmp_path / name).write_text('{"pretrained_cfg": {"embed_dim": 64, "num_heads": 4}}')
    loaded = load_checkpoint(weights)
    assert isinstance(loaded, TerraMindSegmentation)
    x = torch.randn(1, 6, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
