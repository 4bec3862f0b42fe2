"""TerraMind parity against TerraTorch 1.2.13's own code (random weights, fp32, <= 1e-4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from geoserve.models import load_checkpoint
from geoserve.models.terramind import TerraMindEncoder, TerraMindSegmentation
from geoserve.models.terramind.variants import VARIANTS
from tests.models.terramind import reference

TOL = 1e-4
PYRAMID_NECKS = [
    {"name": "SelectIndices", "indices": [2, 5, 8, 11]},
    {"name": "ReshapeTokensToImage", "remove_cls_token": False},
    {"name": "LearnedInterpolateToPyramidal"},
]


def _randomise(model: nn.Module, seed: int) -> None:
    """Weights away from their init (norm scales around 1), so every path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            scale = name.endswith(("norm1.weight", "norm2.weight", "norm.weight"))
            if scale or ".1.weight" in name:
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.05 * noise)
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(1 + 0.1 * torch.rand(b.shape, generator=g))
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def _inputs(shape: tuple[int, int], names: list[str], seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    chans = {"S2L2A": 12, "S2L1C": 13, "S1GRD": 2, "DEM": 1}
    return {n: torch.randn(2, chans[n], *shape, generator=g) for n in names}


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("variant", ["tiny", "base"])
def test_encoder_features_match_the_reference(variant: str) -> None:
    """Every layer's (B, N, D) output, 2 and 1 modalities, 224 px and a non-square size."""
    names = ["S2L2A", "S1GRD"]
    torch.manual_seed(0)
    ref = reference.encoder(variant, modalities=names).eval()
    _randomise(ref, 0)
    ours = TerraMindEncoder({"S2L2A": 12, "S1GRD": 2}, **VARIANTS[f"terramind_v1_{variant}"])
    ref_state = ref.state_dict()
    for key, value in ours.state_dict().items():  # the fixed sin-cos tables, computed alike
        if key.endswith("pos_emb"):
            assert torch.equal(value, ref_state[key]), key
    ours.load_state_dict(ref_state, strict=True)
    ours.eval()
    shapes = [(224, 224), (256, 320)] if variant == "tiny" else [(224, 224)]
    for shape in shapes:
        x = _inputs(shape, names)
        with torch.no_grad():
            want, got = ref(dict(x)), ours(x)
            assert len(got) == 12
            assert got[0].shape == (2, shape[0] * shape[1] // 256, ours.dim)
            assert _max_diff(want, got) <= TOL
            one = {"S1GRD": x["S1GRD"]}
            assert _max_diff(ref(dict(one)), ours(one)) <= TOL
        assert float(want[-1].std()) > 0.1  # the comparison carries signal


def test_non_square_positions_are_resized_bicubically() -> None:
    """Recomputing sin-cos for the new grid would differ; the reference resizes the 14x14 one."""
    ours = TerraMindEncoder({"S2L2A": 12}, **VARIANTS["terramind_v1_tiny"])
    emb = ours.encoder_embeddings["untok_sen2l2a@224"]
    resized = emb.positions(16, 20)
    from geoserve.models.terramind.encoder import sincos_2d

    assert resized.shape == (1, 320, 192)
    assert float((resized - sincos_2d(16, 20, 192)).abs().max()) > 0.1


def _lightning(model: nn.Module, path: Path) -> Path:
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3, "global_step": 10}, path)
    return path


def _config(path: Path, **model_args: object) -> Path:
    cfg = {
        "model": {
            "class_path": "terratorch.tasks.SemanticSegmentationTask",
            "init_args": {
                "model_factory": "EncoderDecoderFactory",
                "model_args": model_args,
                "loss": "ce",
                "freeze_backbone": False,
            },
        }
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize(
    ("decoder", "decoder_kwargs", "config_args"),
    [
        ("UNetDecoder", {"channels": [256, 128, 64, 32]}, {"decoder_channels": [256, 128, 64, 32]}),
        ("UperNetDecoder", {"channels": 64}, {"decoder_channels": 64}),
    ],
)
def test_finetune_logits_match_the_reference(
    tmp_path: Path, decoder: str, decoder_kwargs: dict, config_args: dict
) -> None:
    """S2L1C + S1GRD, loaded from a Lightning checkpoint and its config through load_checkpoint."""
    names = ["S2L1C", "S1GRD"]
    torch.manual_seed(0)
    ref = reference.finetune(
        "tiny",
        names,
        necks=PYRAMID_NECKS,
        decoder=decoder,
        decoder_kwargs=decoder_kwargs,
        num_classes=2,
        head_kwargs={"dropout": 0.1},
    ).eval()
    _randomise(ref, 1)
    ckpt = _lightning(ref, tmp_path / "finetune.ckpt")
    _config(
        tmp_path / "config.yaml",
        backbone="terramind_v1_tiny",
        backbone_pretrained=True,
        backbone_modalities=names,
        necks=PYRAMID_NECKS,
        decoder=decoder,
        head_dropout=0.1,
        num_classes=2,
        **config_args,
    )
    ours = load_checkpoint(ckpt)
    assert isinstance(ours, TerraMindSegmentation)
    assert ours.modalities == names
    for shape in [(224, 224), (200, 264)]:
        x = _inputs(shape, names)
        with torch.no_grad():
            want = ref({k: v.clone() for k, v in x.items()}).output
            got = ours(x)
        assert got.shape == want.shape == (2, 2, *shape)
        assert float((want - got).abs().max()) <= TOL
        assert float(want.std()) > 0.1


def test_the_large_variants_keys_and_shapes_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """small and large, built on the meta device: same parameter names and shapes."""
    linspace = torch.linspace  # the reference reads its drop-path rates with .item()
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: linspace(*a, **k, device="cpu"))
    for variant in ("small", "large"):
        with torch.device("meta"):
            ref = reference.encoder(variant, modalities=["S2L1C", "S1RTC", "DEM"])
            ours = TerraMindEncoder(
                {"S2L1C": 13, "S1RTC": 2, "DEM": 1}, **VARIANTS[f"terramind_v1_{variant}"]
            )
        want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
        assert got == want, variant
