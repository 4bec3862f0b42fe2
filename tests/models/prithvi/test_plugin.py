"""The geoserve-prithvi plugin end to end: CLI, tiny checkpoints in real layouts, real scenes."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import rasterio
import torch

from geoserve import Engine
from geoserve.models.prithvi import PrithviMAE, PrithviSegmentation
from geoserve.models.prithvi.variants import SEN1FLOODS11_MEAN, SEN1FLOODS11_STD
from geoserve.raster.coords import centre_lonlat
from geoserve.raster.source import open_raster
from tests.cli_process import run_in_process
from tests.conftest import FLOOD, HLS, RGB, needs_shared

TINY = dict(embed_dim=64, depth=12, num_heads=1, in_chans=6, img_size=224, patch_size=16)


def tiny_segmentation(seed: int, num_classes: int, **kwargs) -> PrithviSegmentation:
    """A tiny fine-tuned Prithvi with seeded random weights (one date unless told)."""
    torch.manual_seed(seed)
    options = {"feature_indices": (2, 5, 8, 11), "num_frames": 1, **TINY, **kwargs}
    return PrithviSegmentation(num_classes=num_classes, **options).eval()


def tiny_unet(seed: int, num_classes: int, **kwargs) -> PrithviSegmentation:
    return tiny_segmentation(
        seed, num_classes, decoder="unet", decoder_channels=[32, 16, 8, 8], **kwargs
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``geoserve *args`` through ``main()`` in this process, as a fresh process shows it
    (the plugin is found by its entry point here too)."""
    return run_in_process(*args)


@pytest.fixture(scope="module")
def flood_weights(tmp_path_factory) -> tuple:
    model = tiny_segmentation(
        3, 2, decoder_channels=32, coords_encoding=("time", "location"), coords_scale_learn=True
    )
    with torch.no_grad():  # make the two classes compete: a strong, input-dependent head
        model.head.head[2].weight.mul_(50)
    path = tmp_path_factory.mktemp("w") / "Prithvi-EO-V2-300M-TL-Sen1Floods11.pt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 1}, path)
    return path, model


def test_models_lists_the_plugin():
    res = cli("models")
    assert res.returncode == 0
    lines = {line.split()[0]: line for line in res.stdout.splitlines()[1:] if line.strip()}
    assert "required" in lines["prithvi-eo2-300m-tl-sen1floods11"]
    assert "1-3,8,11,12" in lines["prithvi-eo2-300m-tl-sen1floods11"]
    assert "prithvi-eo1-100m" in lines


def test_missing_weights_one_line_with_origin(tmp_path, make_geotiff):
    res = cli(
        "predict",
        str(make_geotiff(bands=6)),
        "-o",
        str(tmp_path / "o.tif"),
        "--model",
        "prithvi-eo2-300m-tl-sen1floods11",
    )
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1
    assert "needs a weights file (--weights FILE on the command line" in res.stderr
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


def test_crops_three_dates_with_coordinates(tmp_path):
    from tests.conftest import write_geotiff

    model = tiny_unet(
        5, 13, num_frames=3, coords_encoding=("time", "location"), coords_scale_learn=True
    )
    weights = tmp_path / "crops.ckpt"
    state = {}
    for k, v in model.state_dict().items():
        state[f"model.{k}"] = v
    torch.save({"state_dict": state}, weights)
    rng = np.random.default_rng(0)
    dates = []
    for t, day in enumerate(("2022-04-01", "2022-06-15", "2022-09-01")):
        data = rng.integers(200, 4000, (6, 230, 250)).astype(np.int16)
        dates.append(write_geotiff(tmp_path / f"d{t}.tif", data, tags={"ACQUISITION_DATE": day}))
    out = tmp_path / "crops.tif"
    res = cli(
        "predict",
        *map(str, dates),
        "--time-series",
        "-o",
        str(out),
        "--model",
        "prithvi-eo2-300m-tl-crops",
        "--weights",
        str(weights),
    )
    assert res.returncode == 0, res.stderr
    with rasterio.open(out) as dst:
        pred = dst.read(1)
        assert dst.shape == (230, 250)
        assert dst.tags()["CLASS_NAMES"].split(",")[2] == "Corn"
        assert len(dst.colormap(1)) >= 13
    assert pred.max() < 13
    no_dates = tmp_path / "nodate.tif"
    write_geotiff(no_dates, rng.integers(0, 100, (6, 32, 32)).astype(np.int16))
    res = cli(
        "predict",
        str(no_dates),
        str(no_dates),
        str(no_dates),
        "--time-series",
        "-o",
        str(tmp_path / "x.tif"),
        "--model",
        "prithvi-eo2-300m-tl-crops",
        "--weights",
        str(weights),
    )
    assert res.returncode == 1
    assert "nodate.tif: no acquisition date found" in res.stderr


def test_burnscars_unet_checkpoint_runs(tmp_path, flood_weights):
    model = tiny_unet(6, 2)
    weights = tmp_path / "burn.pt"
    torch.save({f"model.{k}": v for k, v in model.state_dict().items()}, weights)
    engine = Engine("prithvi-eo2-300m-burnscars", weights=weights, patch_size=224, stride=192)
    from geoserve import RasterArray

    scene = RasterArray(
        np.random.default_rng(1).random((6, 300, 260), dtype=np.float32),
        {"crs": "EPSG:32610", "transform": (30, 0, 500000, 0, -30, 4200000)},
    )
    out = engine.generate_image(scene, out_format="tensor")
    assert out.outputs.tensor.shape == (1, 300, 260)
    from geoserve.errors import WeightsError

    with pytest.raises(
        WeightsError,
        match="holds a upernet model with 2 classes, but model "
        "'prithvi-eo2-300m-burnscars' is a unet model",
    ):
        Engine("prithvi-eo2-300m-burnscars", weights=flood_weights[0])
    with pytest.raises(WeightsError, match="needs a PrithviMAE checkpoint"):
        Engine("prithvi-eo1-100m", weights=weights)
