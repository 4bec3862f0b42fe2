"""Multimodal requests on the CLI: ``predict -i NAME=SOURCE`` and ``info`` on several inputs.

On the seeded synthetic scenes (tests.multimodal_scenes): S2-like at 10 m in EPSG:32633 and a
partial S1-like at ~20 m in EPSG:4326 over the upper-left 60 % (per axis) of it. Most run the
CLI in-process (``main(argv)``); what must happen before torch is imported runs in a fresh
interpreter.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform as warp

from geoserve.cli import main
from geoserve.cli.multimodal import modality_input, request_of
from geoserve.processors import Modality, MultimodalPatcher, RawReassembler
from geoserve.raster.align import TargetGrid
from geoserve.raster.warp import coverage
from tests.multimodal_scenes import write_s1, write_s2
from tests.test_cli_first_use import imported_after

SIZE = 256


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("scenes")
    return write_s2(root / "s2.tif", size=SIZE), write_s1(root / "s1.tif", size=SIZE)


@pytest.fixture(scope="module")
def predicted(scenes, tmp_path_factory) -> tuple[Path, Path, str, str]:
    """``predict -i s2=... -i s1=... -o DIR --quicklook PNG`` with identity, run once."""
    s2, s1 = scenes
    out = tmp_path_factory.mktemp("out")
    png = out / "look.png"
    argv = ["predict", "-i", f"s2={s2}", "-i", f"s1={s1}", "-o", str(out), "-m", "identity"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert main([*argv, "--quicklook", str(png)]) == 0, stderr.getvalue()
    return out / "s2_pred.tif", png, stdout.getvalue(), stderr.getvalue()


def s1_footprint_distance(s1: Path, dst: rasterio.DatasetReader) -> np.ndarray:
    """Per output pixel centre: how far inside the S1 footprint it is, in S1 pixels
    (negative: outside)."""
    rows, cols = np.mgrid[0 : dst.height, 0 : dst.width] + 0.5
    xs, ys = dst.transform @ (cols.ravel(), rows.ravel())
    lon, lat = warp(dst.crs, CRS.from_epsg(4326), xs, ys)
    with rasterio.open(s1) as src:
        c, r = ~src.transform @ (np.asarray(lon), np.asarray(lat))
        inside = np.minimum.reduce([c, src.width - c, r, src.height - r])
    return inside.reshape(dst.height, dst.width)


# -- predict -------------------------------------------------------------------------------------


def test_predict_stacks_the_modalities_on_the_first_ones_grid(scenes, predicted):
    s2, s1 = scenes
    out, png, stdout, stderr = predicted
    assert f"wrote {out} ({SIZE}x{SIZE} on the grid of s2, 6 band(s) float32" in stdout
    assert f"wrote {png} (quicklook)" in stdout
    assert "progress: 4/4 patches (100%)" in stderr
    assert png.stat().st_size > 10_000
    with rasterio.open(out) as dst, rasterio.open(s2) as ref:
        assert (dst.crs, dst.transform, dst.shape) == (ref.crs, ref.transform, ref.shape)
        assert dst.descriptions == ("B2", "B3", "B4", "B8", "VV", "VH")
        data = dst.read()
        np.testing.assert_array_equal(data[:4], ref.read().astype(np.float32))
        inside = s1_footprint_distance(s1, dst)
    radar = data[4:]
    assert np.isnan(radar[:, inside < -1]).all()  # outside the S1 footprint: NaN
    assert np.isfinite(radar[:, inside > 1]).all()  # well inside it: values (dB)
    assert float(np.nanmin(radar[0])) > -25
    assert float(np.nanmax(radar[0])) < 0
    assert 0.3 < np.isfinite(radar[0]).mean() < 0.42  # about 0.6 x 0.6 of the scene


def test_a_modality_given_twice_is_its_dates_and_dates_go_by_name(tmp_path):
    from tests.conftest import write_geotiff

    files = [
        str(write_geotiff(tmp_path / f"t{k}.tif", np.full((1, 16, 16), k + 1, np.int16)))
        for k in range(2)
    ]
    out = tmp_path / "o.tif"
    argv = ["predict", "-m", "test-coords", "-q", "-i", f"a={files[0]}", "-i", f"a={files[1]}"]
    assert main([*argv, "--dates", "a=2021-05-01,a=2021-06-01", "-o", str(out)]) == 0
    with rasterio.open(out) as dst:
        seen = dst.read()[:, 0, 0].tolist()
    assert seen[:6] == [1, 2, 2021, 121, 2021, 152]  # both dates' values, then (year, doy) x 2


@pytest.mark.parametrize(
    ("dates", "message"),
    [
        ("2021-05-01,2021-06-01", "--dates: '2021-05-01': with -i give NAME=DATE for each date"),
        ("b=2021-05-01", "--dates: 'b=2021-05-01': no modality 'b' given with -i (a)"),
        ("a=2021-05-01", "--dates a: 1 date(s) given for 2 input(s)"),
        ("a=2021-05-01,a=2021-13-01", "--dates a: '2021-13-01' is not a date"),
    ],
)
def test_bad_dates_with_modalities_exit_1_one_line(tmp_path, capsys, dates, message):
    from tests.conftest import write_geotiff

    src = str(write_geotiff(tmp_path / "t.tif", np.ones((1, 16, 16), np.int16)))
    code = main(
        ["predict", "-m", "test-coords", "-i", f"a={src}", "-i", f"a={src}", "--dates", dates]
        + ["-o", str(tmp_path / "o.tif")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith(f"geoserve: error: {message}"), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["a.tif", "-i", "s2=b.tif"], "give input files (a.tif) or modalities (-i s2=b.tif), not"),
        (["-i", "s2"], "'s2': expected NAME=SOURCE"),
        (["-i", "=b.tif"], "'=b.tif': empty modality name"),
        (["-i", "s2="], "'s2=': empty source"),
        (["-i", "2a=b.tif"], "'2a=b.tif': invalid modality name '2a'"),
        (["-i", "s-2=b.tif"], "invalid modality name 's-2'"),
        ([], "give input files (IN ...) or modalities (-i NAME=SOURCE ...)"),
        (["-i", "s2=b.tif", "--time-series"], "--time-series is for input files"),
        (["-i", "s2=b.tif", "--ray"], "--ray runs input files"),
    ],
)
def test_usage_errors_exit_2_naming_the_value(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["predict", *argv, "-o", str(tmp_path / "o.tif")])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_mixing_is_refused_and_a_missing_modality_reported_before_torch(scenes, tmp_path):
    s2, _ = scenes
    rc, heavy, err = imported_after("predict", str(s2), "-i", f"s1={s2}", "-o", "x.tif")
    assert (rc, heavy) == (2, set())
    assert f"give input files ({s2}) or modalities (-i s1={s2}), not both" in err
    gone, out = tmp_path / "gone.tif", tmp_path / "o.tif"
    argv = ["predict", "-i", f"s2={s2}", "-i", f"s1={gone}", "-o", str(out), "-m", "identity"]
    rc, heavy, err = imported_after(*argv)
    assert rc == 1
    assert err.strip() == f"geoserve: error: modality 's1': {gone}: no such file"
    assert heavy == set()  # the model never loaded
    assert not out.exists()


def test_request_of_keeps_order_and_groups_dates():
    pairs = [modality_input(t) for t in ("s2=a.tif", "s1=b.tif", "s2=c.tif", "dem=x=y.tif")]
    assert request_of(pairs) == {"s2": ["a.tif", "c.tif"], "s1": "b.tif", "dem": "x=y.tif"}


# -- info ----------------------------------------------------------------------------------------


def test_info_describes_each_modality_the_reference_and_the_warp(scenes, predicted, capsys):
    s2, s1 = scenes
    assert main(["info", "-i", f"s2={s2}", "-i", f"s1={s1}", "--model", "identity"]) == 0
    out = capsys.readouterr().out
    assert "model:     identity, one band stack: the inputs' bands in the order given" in out
    grid = f"{SIZE} x {SIZE} pixels, EPSG:32633, 10 m"
    assert f"reference: the grid of s2 (the output's grid: {grid})" in out
    assert f"\ns2: {s2}\n  size:    {SIZE} x {SIZE} pixels, 4 band(s) uint16" in out
    assert f"\ns1: {s1}\n" in out
    assert "  bands:   VV, VH" in out
    assert "  bounds:  400000, 5797440, 402560, 5800000 (west, south, east, north)" in out
    assert "  grid:    on the reference grid (read as is)" in out
    line = next(ln for ln in out.splitlines() if "warped from" in ln)
    assert line.startswith(
        "  grid:    warped from EPSG:4326 ~20 m to EPSG:32633 10 m, bilinear, covers "
    )
    assert line.endswith(" % of the reference grid")
    said = int(line.split("covers ")[1].split(" %")[0])
    with rasterio.open(predicted[0]) as dst:  # the share it said is the share that got values
        assert said == pytest.approx(100 * np.isfinite(dst.read(5)).mean(), abs=1)
    assert "fits identity: yes (bands B2, B3, B4, B8, VV, VH; 4 patches of 224 px)" in out


def test_info_several_files_follow_a_multimodal_models_reference(scenes, register_model, capsys):
    s2, s1 = scenes

    class Echo(torch.nn.Module):
        def forward(self, x):
            return x["s2"]

    patcher = MultimodalPatcher(
        modalities=(
            Modality("s2", bands=("B3",), resampling="nearest"),
            Modality("s1", bands=("VV",)),
            Modality("dem", required=False),
        ),
        reference="s1",
        patch_size=32,
    )
    name = register_model("test-mm-info", Echo, patcher, RawReassembler())
    assert main(["info", str(s2), str(s1), "--model", name]) == 0  # files: s2, then s1
    out = capsys.readouterr().out
    assert f"model:     {name}, modalities s2 (required), s1 (required), dem (optional)" in out
    assert "reference: the grid of s1 (the output's grid: " in out
    assert "EPSG:4326, ~20 m)" in out
    assert "warped from EPSG:32633 10 m to EPSG:4326 ~20 m, nearest, covers " in out
    assert "dem: not given (optional: absent from the model's input)" in out
    assert "fits test-mm-info: yes (bands s2:B3, s1:VV;" in out
    assert main(["info", "-i", f"s2={s2}", "--model", name]) == 1
    assert "fits test-mm-info: no: modality 's1' is missing" in capsys.readouterr().out
    assert main(["info", str(s2), str(s1), str(s2), str(s1), "--model", name]) == 1
    assert "name each with -i NAME=FILE" in capsys.readouterr().err


def test_info_usage_errors_and_a_missing_modality(scenes, tmp_path, capsys):
    s2, _ = scenes
    with pytest.raises(SystemExit) as info:
        main(["info", str(s2), "-i", f"s1={s2}"])
    assert info.value.code == 2
    assert f"give a file ({s2}) or modalities (-i s1={s2}), not both" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["info"])
    assert info.value.code == 2
    gone = tmp_path / "gone.tif"
    assert main(["info", "-i", f"s2={s2}", "-i", f"s1={gone}", "-m", "identity"]) == 1
    assert f"modality 's1': {gone}: no such file" in capsys.readouterr().err


def test_coverage_from_footprints():
    crs = CRS.from_epsg(32633)
    grid = TargetGrid(crs, Affine(10, 0, 0, 0, -10, 1000), 100, 100)

    class Info:
        def __init__(self, x0: float, res: float, size: int) -> None:
            self.crs, self.width, self.height = crs, size, size
            self.transform = Affine(res, 0, x0, 0, -res, 1000)

    assert coverage(Info(500, 10, 100), grid) == pytest.approx(0.5)  # the right half
    assert coverage(Info(-100, 20, 100), grid) == pytest.approx(1.0)  # all of it
    assert coverage(Info(5000, 10, 10), grid) == 0  # beside it
