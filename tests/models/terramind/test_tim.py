"""TerraMind TiM fine-tunes against TerraTorch 1.2.13's ``TerraMindTiM`` (tiny, random weights).

The reference's tokenizers are stand-ins (TiM decodes no tokens to pixels; an input tokenizer
would run only for a tokenized input, which geoserve refuses).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import torch
import yaml
from rasterio.transform import from_origin
from torch import nn

from geoserve.cli import main
from geoserve.errors import ConfigError, WeightsError
from geoserve.models import load_checkpoint
from geoserve.models.configured import unregister_configured
from geoserve.models.terramind import TerraMindSegmentation
from geoserve.models.terramind.config import parse_spec
from geoserve.models.terramind.configured import terramind_processors
from geoserve.models.terramind.generation import generator_args
from geoserve.models.terramind.tim import TerraMindTiMEncoder
from geoserve.models.terramind.tim_config import TiMOptions
from geoserve.models.terramind.variants import MODALITIES
from geoserve.registry import MODEL_REGISTRY
from tests.models.terramind import reference
from tests.models.terramind.test_parity import _randomise

NECKS = [
    {"name": "SelectIndices", "indices": [2, 5, 8, 11]},
    {"name": "ReshapeTokensToImage", "remove_cls_token": False},
    {"name": "LearnedInterpolateToPyramidal"},
]
DECODER = [64, 32, 16, 8]
CHANNELS = {"S2L2A": 12, "S1GRD": 2, "DEM": 1}
SIZE = 64


def reference_tim(variant: str = "tiny", **kwargs: Any) -> nn.Module:
    """TerraTorch's ``terramind_v1_<variant>_tim``, its tokenizers stand-ins (no weights)."""
    register = reference.load().register
    table = register.tokenizer_dict["v1"]
    saved = dict(table)
    table.update({key: reference._TokensOut for key in table})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "TiM model not pre-trained"
            return getattr(register, f"terramind_v1_{variant}_tim")(**kwargs)
    finally:
        table.clear()
        table.update(saved)


def run_reference(model: nn.Module, x: dict[str, torch.Tensor]) -> Any:
    """The reference reseeds torch's global generator on every call: keep it out of others'."""
    with torch.random.fork_rng(), torch.no_grad():
        return model({k: v.clone() for k, v in x.items()})


def inputs(names: list[str], size: int = SIZE, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(2, CHANNELS[n], size, size, generator=g) for n in names}


def pair(
    inputs_: list[str], tims: list[str], *, chained: bool, merge: str, temperature: float = 0.0
) -> tuple[nn.Module, TerraMindTiMEncoder]:
    """The reference (randomised) and ours, loaded strictly with its state dict."""
    torch.manual_seed(0)
    ref = reference_tim(
        modalities=inputs_,
        tim_modalities=tims,
        tim_chained_generations=chained,
        tim_temps=temperature,
        merge_method=merge,
    ).eval()
    _randomise(ref, 0)
    options = TiMOptions(tuple(tims), tuple(tims), chained, temperature)
    ours = TerraMindTiMEncoder(inputs_, options, merge=merge, **generator_args("tiny"))
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours.eval()


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def chained() -> tuple[nn.Module, TerraMindTiMEncoder]:
    return pair(["S2L2A", "DEM"], ["S1GRD", "LULC"], chained=True, merge="mean")


@pytest.mark.parametrize("kind", ["chained, mean", "apart, concat"])
def test_backbone_features_match_the_reference(
    kind: str, chained: tuple[nn.Module, TerraMindTiMEncoder]
) -> None:
    """Every layer, two inputs and one, two TiM modalities generated in a chain or apart."""
    is_chained = kind.startswith("chained")
    if is_chained:
        ref, ours = chained
    else:
        ref, ours = pair(["S2L2A", "DEM"], ["S1GRD", "LULC"], chained=False, merge="concat")
    assert set(ours.state_dict()) == set(ref.state_dict())
    shared = ours.encoder_embeddings["untok_sen2l2a@224"]
    assert (shared is ours.generator.encoder_embeddings["untok_sen2l2a@224"]) == is_chained
    x = inputs(["S2L2A", "DEM"])
    for given in (x, {"S2L2A": x["S2L2A"]}):
        want = run_reference(ref, given)
        with torch.no_grad():
            got = ours(given)
        width = 192 if is_chained else 192 * 4
        assert got[0].shape == want[0].shape == (2, 16, width)
        assert max_diff(want, got) <= 1e-5
        assert float(want[-1].std()) > 0.1  # the comparison carries signal
    tokens = ours.generate(given)
    assert {k: v.shape for k, v in tokens.items()} == {"S1GRD": (2, 4, 4), "LULC": (2, 4, 4)}
    assert len(torch.unique(tokens["S1GRD"])) > 1
    other = {k: (v + 1) % ours.generator.vocab_size(k) for k, v in tokens.items()}
    with torch.no_grad():  # the generated tokens carry into the features
        seqs = [ours.encoder_embeddings["untok_sen2l2a@224"](given["S2L2A"])]
        for name, ids in other.items():
            emb = ours.encoder_embeddings[ours.tim_keys[name]]
            values, embedding = emb.embed(ids.reshape(2, -1), 4, 4)
            seqs.append(values + embedding)
        assert max_diff(want, ours.encode(seqs)) > 1e-2


def test_sampled_tokens_are_fixed_and_within_the_references_nucleus(
    chained: tuple[nn.Module, TerraMindTiMEncoder],
) -> None:
    """TerraTorch's default sampling (temperature 1, top-p 0.8), without its random draws."""
    ref, ours = chained
    saved = ours.tim, ref.tim_temps, ref.tim_top_p
    try:
        ours.tim = TiMOptions(("S1GRD", "LULC"), ("S1GRD", "LULC"), True, 1.0, 0.8)
        x = inputs(["S2L2A"], seed=4)
        first = ours.generate(x)
        assert all(torch.equal(v, ours.generate(x)[k]) for k, v in first.items())
        alone = ours.generate({"S2L2A": x["S2L2A"][1:]})
        assert all(torch.equal(alone[k][0], v[1]) for k, v in first.items())  # batch-free
        with torch.no_grad():
            logits = ours.generator.logits(x, "S1GRD")
        drawn = first["S1GRD"].reshape(-1, 1)
        assert (drawn[:, 0] != logits.argmax(-1).reshape(-1)).any()  # drawn, not the argmax
        flat = logits.reshape(-1, logits.shape[-1]).clone()
        kept = ref.sampler.top_k_top_p_filtering(flat, 0, 0.8)
        assert bool(torch.isfinite(kept.gather(1, drawn)).all())  # ones TerraTorch could draw
        assert bool((~torch.isfinite(kept)).any())  # (the nucleus dropped some)
        # a nucleus of one token determines TerraTorch's own random draw: the same features
        ours.tim = TiMOptions(("S1GRD", "LULC"), ("S1GRD", "LULC"), True, 1.0, 1e-9)
        ref.tim_temps, ref.tim_top_p = 1.0, 1e-9
        with torch.no_grad():
            assert max_diff(run_reference(ref, x), ours(x)) <= 1e-5
    finally:
        ours.tim, ref.tim_temps, ref.tim_top_p = saved


def test_the_larger_variants_keys_and_shapes_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """small, base (gated MLP) and large, built on the meta device."""
    linspace = torch.linspace  # the reference reads its drop-path rates with .item()
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: linspace(*a, **k, device="cpu"))
    for variant in ("small", "base", "large"):
        with torch.device("meta"):
            ref = reference_tim(variant, modalities=["S1GRD"], tim_modalities=["NDVI", "DEM"])
            ours = TerraMindTiMEncoder(
                ["S1GRD"], TiMOptions(("NDVI", "DEM")), **generator_args(variant)
            )
        want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
        assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == want, variant


def write_config(path: Path, *, data: dict | None = None, **model_args: Any) -> Path:
    args = {
        "backbone": "terramind_v1_tiny_tim",
        "backbone_pretrained": True,
        "backbone_modalities": ["S2L2A"],
        "backbone_tim_modalities": ["LULC"],
        "necks": NECKS,
        "decoder": "UNetDecoder",
        "decoder_channels": DECODER,
        "num_classes": 3,
        **model_args,
    }
    cfg = {
        "model": {
            "class_path": "terratorch.tasks.SemanticSegmentationTask",
            "init_args": {
                "model_factory": "EncoderDecoderFactory",
                "model_args": {k: v for k, v in args.items() if v is not None},
                "class_names": ["water", "field", "town"],
                "tiled_inference_parameters": {"crop": SIZE, "stride": SIZE},
            },
        },
        "data": {
            "class_path": "terratorch.datamodules.GenericMultiModalDataModule",
            "init_args": data or {"modalities": ["S2L2A"]},
        },
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def reference_finetune() -> nn.Module:
    """A TiM UNet fine-tune composed as TerraTorch's EncoderDecoderFactory does (argmax TiM)."""
    ref = reference.load()
    torch.manual_seed(0)
    backbone = reference_tim(modalities=["S2L2A"], tim_modalities=["LULC"], tim_temps=0.0)
    channels, neck_list = list(backbone.out_channels), []
    for spec in NECKS:
        op = getattr(ref.necks, spec["name"])(
            channels, **{k: v for k, v in spec.items() if k != "name"}
        )
        channels = op.process_channel_list(channels)
        neck_list.append(op)
    model = ref.pixel_wise.PixelWiseModel(
        "segmentation",
        backbone,
        ref.unet.UNetDecoder(channels, channels=DECODER),
        {"num_classes": 3},
        patch_size=16,
        padding="reflect",
        neck=ref.necks.NeckSequential(*neck_list),
    ).eval()
    _randomise(model, 2)
    with torch.no_grad():
        model.head.head[2].weight.mul_(30)  # classes that compete
    return model


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tim")
    ref = reference_finetune()
    state = {f"model.{k}": v for k, v in ref.state_dict().items()}
    state["model.encoder.tokenizer.tok_lulc@224.encoder.proj.weight"] = torch.zeros(2, 2)
    ckpt = root / "best.ckpt"
    torch.save({"state_dict": state, "epoch": 1}, ckpt)
    return {
        "root": root,
        "ref": ref,
        "ckpt": ckpt,
        "argmax": write_config(root / "argmax.yaml", backbone_tim_temps=0.0),
        "default": write_config(root / "config.yaml"),  # TerraTorch's sampling defaults
    }


def test_finetune_logits_match_the_reference(fine_tune: dict[str, Any]) -> None:
    """Loaded strictly from a Lightning checkpoint (tokenizer weights dropped) and its config."""
    ours = load_checkpoint(fine_tune["ckpt"], config=fine_tune["argmax"])
    assert isinstance(ours, TerraMindSegmentation)
    assert isinstance(ours.encoder, TerraMindTiMEncoder)
    assert ours.modalities == ["S2L2A"]
    for size in (SIZE, 40):  # 40 px: reflect-padded to 64 as TerraTorch pads
        x = inputs(["S2L2A"], size, seed=5)
        want = run_reference(fine_tune["ref"], x).output
        with torch.no_grad():
            got = ours(x)
        assert got.shape == want.shape == (2, 3, size, size)
        assert float((want - got).abs().max()) <= 1e-5
        assert float(want.std()) > 0.1


def write_scene(path: Path) -> np.ndarray:
    rng = np.random.default_rng(3)
    mean = np.array(MODALITIES["S2L2A"].mean)[:, None, None]
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    wet = (yy - 30) ** 2 + (xx - 20) ** 2 < 300
    data = mean * np.where(wet, 0.3, 1.3) + rng.normal(0, 400, (12, SIZE, SIZE))
    data = np.clip(data, 1, 10000).astype("uint16")
    with rasterio.open(
        path, "w", driver="GTiff", width=SIZE, height=SIZE, count=12, dtype="uint16",
        crs="EPSG:32633", transform=from_origin(500000, 4000000, 10, 10),
    ) as dst:  # fmt: skip
        dst.write(data)
    return data


@pytest.fixture
def forget_registered() -> Iterator[None]:
    before = set(MODEL_REGISTRY.names())
    yield
    for name in set(MODEL_REGISTRY.names()) - before:
        unregister_configured(name)


def test_predict_serves_a_tim_finetune_on_the_inputs_grid(
    fine_tune: dict[str, Any], tmp_path: Path, forget_registered: None
) -> None:
    """``predict --config-file --weights``: the class map of the model run by hand."""
    scene = tmp_path / "s2.tif"
    raw = write_scene(scene)
    out = tmp_path / "classes.tif"
    cfg = fine_tune["default"]
    argv = ["predict", str(scene), "-o", str(out), "--config-file", str(cfg)]
    assert main([*argv, "--weights", str(fine_tune["ckpt"]), "-q"]) == 0
    with rasterio.open(out) as dst, rasterio.open(scene) as src:
        assert (dst.crs, dst.transform, dst.shape) == (src.crs, src.transform, src.shape)
        assert dst.tags()["CLASS_NAMES"] == "water,field,town"
        got = dst.read(1)
    info = MODALITIES["S2L2A"]
    mean, std = (np.array(v, np.float32)[:, None, None] for v in (info.mean, info.std))
    x = torch.from_numpy((raw.astype(np.float32) - mean) / std)[None]
    model = load_checkpoint(fine_tune["ckpt"], config=cfg)
    assert model.encoder.tim.temperature == 1.0  # TerraTorch's default: drawn tokens
    with torch.no_grad():
        want = model(x)[0].argmax(0).numpy()
    assert len(np.unique(want)) > 1  # the comparison means something
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ({"backbone_tim_modalities": ["caption"]}, ConfigError, "'caption'.*text tokenizer"),
        ({"backbone_tim_modalities": ["LULC", "location"]}, ConfigError, "'location'"),
        ({"backbone_tim_modalities": ["RGB"]}, ConfigError, "unknown TiM modality 'RGB'"),
        ({"backbone_tim_modalities": ["lulc", "LULC"]}, ConfigError, "one modality twice"),
        ({"backbone_tim_modalities": ["S2L2A"]}, ConfigError, "S2L2A is in both"),
        ({"backbone_tim_decoding_steps": 4}, ConfigError, "backbone_tim_decoding_steps 4"),
        ({"backbone_bands": {"S2L2A": ["RED"]}}, ConfigError, "backbone_bands: a TiM"),
        ({"backbone_tim_temps": "hot"}, WeightsError, "backbone_tim_temps must be a number"),
        ({"backbone_tim_top_p": 2}, WeightsError, "backbone_tim_top_p must be"),
        ({"backbone_tim_chained_generations": 1}, WeightsError, "true or false"),
        ({"backbone_tim_mode": 1}, WeightsError, "does not take backbone_tim_mode"),
        ({"backbone": "terramind_v1_huge_tim"}, WeightsError, "backbone must be one of"),
        ({"backbone": "terramind_v1_tiny"}, WeightsError, "does not take backbone_tim_modal"),
    ],
)
def test_unsupported_tim_configs_are_refused_by_name(
    tmp_path: Path, args: dict, error: type[Exception], match: str
) -> None:
    cfg = yaml.safe_load(write_config(tmp_path / "c.yaml", **args).read_text())
    with pytest.raises(error, match=match):
        parse_spec(cfg["model"]["init_args"]["model_args"], "c.yaml")


def test_tim_config_reading(tmp_path: Path) -> None:
    spec = parse_spec(yaml.safe_load(write_config(tmp_path / "c.yaml").read_text())["model"]
                      ["init_args"]["model_args"], "c.yaml")  # fmt: skip
    assert spec.variant == "terramind_v1_tiny"
    assert spec.tim == TiMOptions(("LULC",), ("LULC",), True, 1.0, 0.8, 0)
    _, _, describe = terramind_processors(tmp_path / "c.yaml")
    assert "thinking in LULC (TiM)" in describe
    subset = {"modalities": ["S2L2A"], "output_bands": {"S2L2A": ["RED", "GREEN", "BLUE"]}}
    with pytest.raises(WeightsError, match=r"output_bands\.S2L2A: a TiM model takes all"):
        terramind_processors(write_config(tmp_path / "d.yaml", data=subset))


def test_checkpoints_and_configs_that_disagree_are_named(
    fine_tune: dict[str, Any], tmp_path: Path
) -> None:
    lone = tmp_path / "lone.ckpt"  # (no config beside it)
    lone.write_bytes(fine_tune["ckpt"].read_bytes())
    with pytest.raises(WeightsError, match="a TerraMind TiM fine-tune .*no config with it"):
        load_checkpoint(lone)
    plain = write_config(tmp_path / "plain.yaml", backbone="terramind_v1_tiny",
                         backbone_tim_modalities=None)  # fmt: skip
    with pytest.raises(WeightsError, match=f"TiM fine-tune .*config {plain} names no TiM"):
        load_checkpoint(fine_tune["ckpt"], config=plain)
    ndvi = write_config(tmp_path / "ndvi.yaml", backbone_tim_modalities=["NDVI"])
    with pytest.raises(WeightsError, match="tok_ndvi@224"):
        load_checkpoint(fine_tune["ckpt"], config=ndvi)
