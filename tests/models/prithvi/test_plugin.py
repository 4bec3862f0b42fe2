"""The geoserve-prithvi plugin end to end: CLI, tiny checkpoints in real layouts, real scenes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import rasterio
import torch

from geoserve import Engine
from geoserve.models.prithvi import PrithviMAE, PrithviSegmentation
from geoserve.models.prithvi.variants import SEN1FLOODS11_MEAN, SEN1FLOODS11_STD
from geoserve.raster.coords import centre_lonlat
from geoserve.raster.source import open_raster
from tests.conftest import FLOOD, HLS, RGB, needs_shared

TINY = dict(embed_dim=64, depth=12, num_heads=1, in_chans=6, img_size=224, patch_size=16)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "geoserve", *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def flood_weights(tmp_path_factory) -> tuple:
    torch.manual_seed(3)
    model = PrithviSegmentation(
        num_classes=2,
        feature_indices=(2, 5, 8, 11),
        decoder_channels=32,
        num_frames=1,
        coords_encoding=("time", "location"),
        coords_scale_learn=True,
        **TINY,
    ).eval()
    with torch.no_grad():  # make the two classes compete: a strong, input-dependent head
        model.head.head[2].weight.mul_(50)
    path = tmp_path_factory.mktemp("w") / "Prithvi-EO-V2-300M-TL-Sen1Floods11.pt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 1}, path)
    return path, model


def test_models_lists_the_plugin():
    res = cli("models")
    assert res.returncode == 0
    lines = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    assert "needs --weights" in lines["prithvi-eo2-300m-tl-sen1floods11"]
    assert "1,2,3,8,11,12" in lines["prithvi-eo2-300m-tl-sen1floods11"]
    assert "prithvi-eo1-100m" in lines


def test_missing_weights_one_line_with_origin(tmp_path):
    res = cli(
        "predict",
        "x.tif",
        "-o",
        str(tmp_path / "o.tif"),
        "--model",
        "prithvi-eo2-300m-tl-sen1floods11",
    )
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1
    assert "needs weights: pass --weights FILE" in res.stderr
    assert "huggingface.co/ibm-nasa-geospatial/Prithvi-EO-2.0-300M-TL-Sen1Floods11" in res.stderr


@needs_shared(FLOOD)
def test_sen1floods11_cli_on_the_real_chip_equals_the_model(tmp_path, flood_weights):
    path, model = flood_weights
    out = tmp_path / "water.tif"
    res = cli(
        "predict",
        str(FLOOD),
        "-o",
        str(out),
        "--model",
        "prithvi-eo2-300m-tl-sen1floods11",
        "--weights",
        str(path),
        "--patch-size",
        "512",
        "--stride",
        "512",
        "--blend",
        "none",
    )
    assert res.returncode == 0, res.stderr
    with open_raster(FLOOD) as src:
        raw = src.read_rows(0, 512, [1, 2, 3, 8, 11, 12]).astype(np.float32) * 1e-4
        lonlat = centre_lonlat(src.info)
    mean = np.array(SEN1FLOODS11_MEAN, dtype=np.float32)[:, None, None]
    std = np.array(SEN1FLOODS11_STD, dtype=np.float32)[:, None, None]
    x = torch.from_numpy((raw - mean) / std)[None]
    with torch.inference_mode():
        logits = model(x, location_coords=torch.tensor([lonlat], dtype=torch.float32))
    expected = logits.argmax(1)[0].numpy()
    with rasterio.open(out) as dst, rasterio.open(FLOOD) as src:
        pred = dst.read(1)
        assert (dst.crs, dst.transform, dst.shape) == (src.crs, src.transform, src.shape)
        assert dst.tags()["CLASS_NAMES"] == "not water,water"
    assert set(np.unique(pred)) <= {0, 1}
    assert (pred == expected).mean() > 0.999  # float noise may flip a tie or two
    assert 0.001 < pred.mean() < 0.999  # both classes occur: the comparison is not vacuous


@needs_shared(RGB)
def test_wrong_band_count_names_file_and_bands(tmp_path, flood_weights):
    res = cli(
        "predict",
        str(RGB),
        "-o",
        str(tmp_path / "o.tif"),
        "--model",
        "prithvi-eo2-300m-tl-sen1floods11",
        "--weights",
        str(flood_weights[0]),
    )
    assert res.returncode == 1
    assert "RGB.byte.tif has 3 bands; band index" in res.stderr
    assert "prithvi-eo2-300m-tl-sen1floods11" in res.stderr


@needs_shared(HLS)
def test_mae_reconstruction_three_dates(tmp_path):
    torch.manual_seed(4)
    model = PrithviMAE(num_frames=3, decoder_embed_dim=32, decoder_depth=1, **TINY).eval()
    weights = tmp_path / "Prithvi_EO_V1_100M.pt"
    torch.save({k.split(".", 1)[1]: v for k, v in model.state_dict().items()}, weights)  # v1
    engine = Engine("prithvi-eo1-100m", weights=weights, bands=[1, 2, 3, 4, 5, 6])
    out = engine.generate_image([[HLS, HLS, HLS]], output_path=tmp_path)[0].raise_for_error()
    with rasterio.open(out.outputs.path) as dst, rasterio.open(HLS) as src:
        assert dst.count == 18
        assert dst.dtypes[0] == "float32"
        assert dst.descriptions[0] == "t0_BLUE"
        assert dst.descriptions[-1] == "t2_SWIR_2"
        assert (dst.crs, dst.transform) == (src.crs, src.transform)
        assert np.isfinite(dst.read()).all()
    too_few = engine.generate_image([[HLS]], output_path=tmp_path)[0]
    assert "takes 3 date(s) per request, got 1" in str(too_few.error)
