"""The geoserve-terramind plugin end to end: CLI and HTTP, a tiny fine-tune, real GeoTIFFs."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio
import torch

from geoserve import Engine
from geoserve.models.terramind import TerraMindSegmentation
from geoserve.models.terramind.variants import MODALITIES, VARIANTS
from tests.multimodal_scenes import s2_transform, write_s1
from tests.server.conftest import running_server

SIZE = 224  # one patch of the registered models: the by-hand check needs no stitching
MODEL = "terramind-v1-sen1floods11"
NECKS = [
    {"name": "SelectIndices", "indices": [2, 5, 8, 11]},
    {"name": "ReshapeTokensToImage", "remove_cls_token": False},
    {"name": "LearnedInterpolateToPyramidal"},
]


def tiny_finetune(modalities: dict[str, int], seed: int = 0) -> TerraMindSegmentation:
    """A TerraMind-tiny UNet fine-tune with seeded weights whose two classes compete."""
    torch.manual_seed(seed)
    model = TerraMindSegmentation(
        dict(modalities=modalities, **VARIANTS["terramind_v1_tiny"]),
        necks=NECKS,
        decoder="UNetDecoder",
        decoder_args={"channels": [64, 32, 16, 8]},
        num_classes=2,
    ).eval()
    with torch.no_grad():
        for p in model.encoder.parameters():
            if p.ndim > 1:
                p.normal_(0, 0.05)
        model.head.head[2].weight.mul_(50)
    return model


def save_lightning(model: torch.nn.Module, path: Path) -> Path:
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, path)
    return path


def write_s2_l1c(path: Path, seed: int = 0) -> np.ndarray:
    """A 13-band uint16 S2 L1C-like scene on the S2 grid of tests.multimodal_scenes."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    water = (yy - SIZE / 2) ** 2 + (xx - SIZE / 3) ** 2 < (SIZE / 4) ** 2
    mean = np.array(MODALITIES["S2L1C"].mean)[:, None, None]
    data = mean * np.where(water, 0.4, 1.2) + rng.normal(0, 150, (13, SIZE, SIZE))
    data = np.clip(data, 1, 10000).astype("uint16")
    profile = dict(
        driver="GTiff", width=SIZE, height=SIZE, count=13, dtype="uint16", crs="EPSG:32633"
    )
    with rasterio.open(path, "w", transform=s2_transform(), **profile) as dst:
        dst.write(data)
    return data


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("terramind")
    model = tiny_finetune({"S2L1C": 13, "S1GRD": 2})
    s2 = write_s2_l1c(root / "s2.tif")
    write_s1(root / "s1.tif", SIZE)
    return {
        "root": root,
        "model": model,
        "s2": s2,
        "weights": save_lightning(model, root / "tm.ckpt"),
    }


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "geoserve", *args], capture_output=True, text=True, timeout=600
    )


def _read(path: Path) -> tuple[np.ndarray, dict]:
    with rasterio.open(path) as src:
        return src.read(1), {"crs": src.crs, "transform": src.transform}


def test_s2_only_equals_the_model_by_hand(scene, tmp_path: Path) -> None:
    """S1 is optional: an S2-only request is the model on the normalised S2 scene."""
    root = scene["root"]
    out = tmp_path / "s2only.tif"
    res = cli(
        "predict", "-i", f"S2L1C={root / 's2.tif'}", "-o", str(out), "--model", MODEL,
        "--weights", str(scene["weights"]), "--stride", "224", "--blend", "none",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got, grid = _read(out)
    info = MODALITIES["S2L1C"]
    x = (scene["s2"].astype("float32") - np.array(info.mean, "float32")[:, None, None]) / np.array(
        info.std, "float32"
    )[:, None, None]
    with torch.no_grad():
        logits = scene["model"]({"S2L1C": torch.from_numpy(x)[None]})
    want = logits[0].argmax(0).numpy()
    assert grid["transform"] == s2_transform()
    assert 0.05 < want.mean() < 0.95  # both classes present: the comparison means something
    assert (got == want).mean() > 0.9999  # argmax ties at float rounding aside


def test_s2_and_s1_fuse_on_the_s2_grid(scene, tmp_path: Path) -> None:
    root = scene["root"]
    both = tmp_path / "both.tif"
    res = cli(
        "predict", "-i", f"S2L1C={root / 's2.tif'}", "-i", f"S1GRD={root / 's1.tif'}",
        "-o", str(both), "--model", MODEL, "--weights", str(scene["weights"]),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    fused, grid = _read(both)
    engine = Engine(MODEL, weights=scene["weights"])
    alone = engine.generate_image({"S2L1C": str(root / "s2.tif")}, out_format="tensor")
    assert grid["transform"] == s2_transform()
    assert set(np.unique(fused)) <= {0, 1}
    assert (fused != alone.outputs.tensor.numpy()[0]).any()  # the radar changed the answer
    s1_only = engine.generate_image({"S1GRD": str(root / "s1.tif")}, out_format="path",
                                    output_path=tmp_path / "s1.tif")  # fmt: skip
    with rasterio.open(s1_only.outputs.path) as dst, rasterio.open(root / "s1.tif") as s1:
        assert dst.crs == s1.crs  # an S1-only request runs on the S1 grid
        assert dst.transform == s1.transform


def test_weights_of_another_modality_set_are_refused(scene, tmp_path: Path) -> None:
    other = save_lightning(tiny_finetune({"S2L2A": 12}), tmp_path / "s2l2a.ckpt")
    res = cli(
        "predict", "-i", f"S2L1C={scene['root'] / 's2.tif'}", "-o", str(tmp_path / "x.tif"),
        "--model", MODEL, "--weights", str(other),
    )  # fmt: skip
    assert res.returncode != 0
    assert "'S2L2A': 12" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "x.tif").exists()


@pytest.fixture(scope="module")
def server(scene) -> Iterator[str]:
    with running_server(
        model=MODEL, weights=scene["weights"], allowed_input_dirs=[scene["root"]]
    ) as url:
        yield url


def test_http_modality_dict_equals_offline(scene, server: str) -> None:
    root = scene["root"]
    data = {"S2L1C": str(root / "s2.tif"), "S1GRD": str(root / "s1.tif")}
    with httpx.Client(base_url=server, timeout=120) as client:
        models = client.get("/v1/models").json()
        resp = client.post("/v1/images", json={"data": data, "data_format": "path"})
    assert resp.status_code == 200, resp.text
    listed = next(m for m in models["data"] if m["id"] == MODEL)
    assert [m["name"] for m in listed["input"]["modalities"]] == ["S2L1C", "S1GRD"]
    assert [m["required"] for m in listed["input"]["modalities"]] == [False, False]
    # the MemoryFile must outlive the read: GDAL reads its bytes in place, without a copy
    with rasterio.MemoryFile(base64.b64decode(resp.json()["data"])) as mem, mem.open() as src:
        got = src.read(1)
    engine = Engine(MODEL, weights=scene["weights"])
    want = engine.generate_image(dict(data), out_format="tensor").outputs.tensor
    np.testing.assert_array_equal(got, np.asarray(want).reshape(got.shape))


def test_embeddings_are_the_merged_encoder_tokens(scene, tmp_path: Path) -> None:
    """One pass gives the class map and the encoder's tokens on the 16-pixel token grid."""
    root = scene["root"]
    kinds = ["classes", "embeddings", "patch-embeddings"]
    options = {"stride": 224, "blend": "none", "output_kind": kinds}
    with Engine(MODEL, weights=scene["weights"], **options) as engine:
        result = engine.generate_image({"S2L1C": str(root / "s2.tif")}, output_path=tmp_path / "t")
    with rasterio.open(result.outputs_by_kind["embeddings"].path) as src:
        tokens = src.read()
        assert src.transform == s2_transform() @ rasterio.Affine.scale(16)
    info = MODALITIES["S2L1C"]
    mean, std = (np.array(v, "float32")[:, None, None] for v in (info.mean, info.std))
    x = torch.from_numpy((scene["s2"].astype("float32") - mean) / std)[None]
    with torch.no_grad():
        last = scene["model"].encoder({"S2L1C": x})[-1][0]
    by_hand = last.T.reshape(-1, SIZE // 16, SIZE // 16).numpy()
    assert tokens.shape == by_hand.shape == (192, 14, 14)  # TerraMind tiny: 192 wide
    np.testing.assert_allclose(tokens, by_hand, rtol=1e-4, atol=1e-5)
    pooled = result.outputs_by_kind["patch-embeddings"]
    assert pooled.count == 1  # one patch, one row
