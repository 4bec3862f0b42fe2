"""The CLI end to end on real files: through ``main()`` in this process, as a fresh process
would show it (:mod:`tests.cli_process`), and the entry point in a subprocess."""

from pathlib import Path

import numpy as np
import pytest
import rasterio

from tests.cli_process import run_in_process, run_subprocess
from tests.conftest import FLOOD, LAKE, RGB, needs_shared

#: Every warning shown (once per place), as ``PYTHONWARNINGS=default`` shows them
WARNINGS_SHOWN = {"PYTHONWARNINGS": "default"}


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    """``geoserve *args`` in this process, every warning shown; what ``subprocess.run`` gives."""
    return run_in_process(*args, cwd=cwd, env={**WARNINGS_SHOWN, **(env or {})})


def run_process(*args: str, env: dict[str, str] | None = None):
    """``python -m geoserve *args`` in a subprocess, every warning shown."""
    return run_subprocess(*args, env={**WARNINGS_SHOWN, **(env or {})})


@needs_shared(LAKE)
def test_predict_lake_scene(tmp_path):
    out = tmp_path / "water.tif"
    res = run("predict", str(LAKE), "-o", str(out), "--model", "ndwi-water")
    assert res.returncode == 0, res.stderr
    assert f"wrote {out} (1536x768, 1 band(s) uint8" in res.stdout
    with rasterio.open(out) as dst, rasterio.open(LAKE) as src:
        assert (dst.crs, dst.transform) == (src.crs, src.transform)
        water = (dst.read(1) == 1).mean()
    assert 0.03 < water < 0.15  # about 7.5 % of this scene has NDWI > 0


def test_missing_file_exit_1_one_line(tmp_path):
    """In a subprocess: the entry point's exit code and its stderr, exactly one line."""
    res = run_process("predict", str(tmp_path / "gone.tif"), "-o", str(tmp_path / "o.tif"))
    assert res.returncode == 1
    assert res.stderr.strip() == f"geoserve: error: {tmp_path / 'gone.tif'}: no such file"
    assert "Traceback" not in res.stderr


def test_unknown_model_exit_1_lists_models(tmp_path, make_geotiff):
    src = make_geotiff()
    res = run("predict", str(src), "-o", str(tmp_path / "o.tif"), "--model", "ndwi-watr")
    assert res.returncode == 1
    assert "unknown model 'ndwi-watr' (did you mean 'ndwi-water'" in res.stderr
    assert "identity" in res.stderr
    assert "Traceback" not in res.stderr


@needs_shared(RGB)
def test_wrong_bands_exit_1_names_file_band_and_model(tmp_path):
    res = run("predict", str(RGB), "-o", str(tmp_path / "o.tif"), "--model", "ndwi-water")
    assert res.returncode == 1
    assert "RGB.byte.tif: no band named 'B3'" in res.stderr
    assert "'ndwi-water'" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o.tif").exists()


def test_a_file_demo_water_cannot_read_is_told_what_it_takes(tmp_path, capsys):
    """The band error, and ``info``'s "fits: no", say the model's input in words."""
    from geoserve.cli import main

    stack = "a 13-band Sentinel-2 L1C stack (B01-B08, B8A, B09-B12, in that order)"
    assert main(["predict", str(RGB), "-o", str(tmp_path / "o.tif"), "-m", "demo-water"]) == 1
    err = capsys.readouterr().err
    assert "RGB.byte.tif has 3 bands; band index 3 (0-based) does not exist; model " in err
    assert f"'demo-water' takes {stack}, 10 m" in err
    assert "; it reads bands 1, 2, 3, 8, 11, 12 (0-based) (choose others with --bands" in err
    assert not (tmp_path / "o.tif").exists()
    assert main(["info", str(RGB), "--model", "demo-water"]) == 1
    assert f"does not exist; it takes {stack}" in capsys.readouterr().out


@needs_shared(RGB)
def test_debug_shows_traceback(tmp_path):
    res = run("--debug", "predict", str(RGB), "-o", str(tmp_path / "o.tif"))
    assert res.returncode == 1
    assert "Traceback" in res.stderr


def test_usage_error_exit_2(tmp_path):
    assert run_process("predict").returncode == 2  # the entry point's own exit code
    res = run("predict", "a.tif", "-o", "b.tif", "--blend", "gauss")
    assert res.returncode == 2
    assert "invalid choice" in res.stderr
    assert run("predict", "a.tif", "-o", "b.tif", "--batch-size", "0").returncode == 2


def test_bad_option_value_exit_1(tmp_path, make_geotiff):
    src = make_geotiff(bands=3)
    res = run(
        "predict",
        str(src),
        "-o",
        str(tmp_path / "o.tif"),
        "--model",
        "identity",
        "--patch-size",
        "16",
        "--stride",
        "32",
    )
    assert res.returncode == 1
    assert "invalid stride: 32" in res.stderr


def test_models_lists_builtins():
    res = run("models")
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert lines[0].split()[:5] == ["MODEL", "PLUGIN", "BANDS", "OUTPUT", "WEIGHTS"]
    assert any(line.startswith("ndwi-water") and "B3,B8" in line for line in lines)
    assert any(line.startswith("identity") for line in lines)


@needs_shared(FLOOD)
def test_several_inputs_one_bad_summary_and_exit_1(tmp_path, make_geotiff):
    other = make_geotiff(bands=3, descriptions=["B2", "B3", "B8"], name="small.tif")
    outdir = tmp_path / "out"
    res = run(
        "predict",
        str(FLOOD),
        str(tmp_path / "nope.tif"),
        str(other),
        "-o",
        str(outdir),
        "--model",
        "ndwi-water",
        "--output-kind",
        "probabilities",
        "--blend",
        "cosine",
        "--stride",
        "160",
    )
    assert res.returncode == 1
    assert "nope.tif: no such file" in res.stderr
    assert "2 of 3 inputs done, 1 failed" in res.stdout
    with rasterio.open(outdir / "Spain_7370579_S2Hand_pred.tif") as dst:
        probs = dst.read()
        assert dst.count == 2
        assert dst.descriptions == ("not water", "water")
    valid = ~np.isnan(probs[0])
    np.testing.assert_allclose(probs[:, valid].sum(0), 1, rtol=1e-5)
    assert (outdir / "small_pred.tif").exists()


@needs_shared(LAKE)
def test_default_model_progress_lines_and_quicklook(tmp_path):
    out, png = tmp_path / "w.tif", tmp_path / "w.png"
    res = run("predict", str(LAKE), "-o", str(out), "--quicklook", str(png))
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("progress: ")]
    assert lines, res.stderr
    assert lines[-1].startswith("progress: 32/32 patches (100%)")
    assert "patches/s" in lines[-1]
    with rasterio.open(out) as dst:
        assert dst.tags()["CLASS_NAMES"] == "not water,water"  # the demo model by default
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.float32)
    assert img.shape == (400, 1200, 3)  # two 1536 x 768 panels, 12 x 4 inches at 100 dpi
    assert img.std() > 20  # not blank
    quiet = run("predict", str(LAKE), "-o", str(tmp_path / "q.tif"), "-q")
    assert quiet.returncode == 0
    assert quiet.stdout == ""
    assert "progress" not in quiet.stderr


@needs_shared(FLOOD)
def test_quicklook_for_probabilities_has_a_colour_bar(tmp_path):
    png = tmp_path / "p.png"
    res = run(
        "predict",
        str(FLOOD),
        "-o",
        str(tmp_path / "p.tif"),
        "--output-kind",
        "probabilities",
        "--quicklook",
        str(png),
        "-q",
    )
    assert res.returncode == 0, res.stderr
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.float32)
    assert img.std() > 20


@needs_shared(LAKE)
def test_info_describes_the_file_and_checks_a_model(tmp_path):
    res = run("info", str(LAKE))
    assert res.returncode == 0, res.stderr
    assert "1536 x 768 pixels, 13 band(s) uint16" in res.stdout
    assert "EPSG:32633" in res.stdout
    assert "pixel:     10 x 10 m" in res.stdout
    assert "date:      2017-02-16" in res.stdout
    assert "band  8:   B8A" in res.stdout
    assert "layout:    tiles of 256 x 256, deflate" in res.stdout
    assert "layout:    strips of 3 row(s), uncompressed" in run("info", str(RGB)).stdout
    fits = run("info", str(LAKE), "--model", "demo-water")
    assert fits.returncode == 0
    assert (
        "fits demo-water: yes (bands 1, 2, 3, 8, 11, 12: B2, B3, B4, B8A, B11, B12" in fits.stdout
    )


@needs_shared(RGB)
def test_info_says_why_a_file_does_not_fit(tmp_path):
    res = run("info", str(RGB), "--model", "ndwi-water")
    assert res.returncode == 1
    assert "fits ndwi-water: no: " in res.stdout
    assert "no band named 'B3'" in res.stdout
    missing = run("info", str(tmp_path / "none.tif"))
    assert missing.returncode == 1
    assert "none.tif: no such file" in missing.stderr


@pytest.mark.parametrize(
    ("served", "extra"),
    [
        pytest.param(
            False,
            ["--batch-size", "auto", "--read-workers", "1", "--prefetch-rows", "0"]
            + ["--preprocess", "device"],
            id="pipeline-knobs",
        ),
        # `geoserve predict https://...`: the COG is read by range requests, not downloaded
        pytest.param(True, [], id="url-read-in-place"),
    ],
)
def test_predict_output_is_the_same_however_it_runs(tmp_path, served, extra):
    from geoserve.cli import main
    from tests.conftest import serve_ranges, write_geotiff

    rng = np.random.default_rng(4)
    src = write_geotiff(
        tmp_path / "scene.tif",
        rng.integers(0, 3000, (3, 500, 400)).astype(np.uint16),
        descriptions=["B2", "B3", "B8"],
        tiled=True,
        blockxsize=256,
        blockysize=256,
        compress="deflate",
    )
    ref, other = tmp_path / "ref.tif", tmp_path / "other.tif"
    assert main(["predict", str(src), "-o", str(ref), "-m", "ndwi-water", "-q"]) == 0
    with serve_ranges(tmp_path) as (base, log):
        scene = f"{base}/scene.tif" if served else str(src)
        assert main(["predict", scene, "-o", str(other), "-m", "ndwi-water", "-q", *extra]) == 0
    with rasterio.open(ref) as a, rasterio.open(other) as b:
        np.testing.assert_array_equal(a.read(), b.read())
        assert a.transform == b.transform
    gets = [entry for entry in log if entry[0] == "GET"]
    assert (len(gets) > 1) == served
    assert all(r is not None for _, _, r in gets)


def test_predict_with_weights_from_the_hub_cache_offline(tmp_path, make_geotiff):
    """``--weights hf://...`` end to end: read from a Hub cache with HF_HUB_OFFLINE set."""
    from safetensors.torch import load_file, save

    from geoserve.cli import main
    from geoserve.models.demo import weights_path
    from tests.hub_cache import COMMIT, ORG, add_file, set_ref

    state = load_file(str(weights_path()))
    state["head.weight"], state["head.bias"] = -state["head.weight"], -state["head.bias"]
    data = save(state)  # the demo model with its two classes swapped
    cache = tmp_path / "hub"
    add_file(cache, "water.safetensors", data, repo="demo")
    set_ref(cache, "main", COMMIT, repo="demo")
    scene = make_geotiff(bands=13, height=40, width=50)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}

    by_hub = tmp_path / "hub.tif"
    argv = ["predict", str(scene), "--model", "demo-water", "-q"]
    res = run(*argv, "-o", str(by_hub), "--weights", f"hf://{ORG}/demo", env=env)
    assert res.returncode == 0, res.stderr
    local = tmp_path / "local.safetensors"
    local.write_bytes(data)
    assert main([*argv, "-o", str(tmp_path / "local.tif"), "--weights", str(local)]) == 0
    assert main([*argv, "-o", str(tmp_path / "own.tif")]) == 0
    with (
        rasterio.open(by_hub) as a,
        rasterio.open(tmp_path / "local.tif") as b,
        rasterio.open(tmp_path / "own.tif") as c,
    ):
        hub, same, own = a.read(1), b.read(1), c.read(1)
    np.testing.assert_array_equal(hub, same)
    assert (hub != own).mean() > 0.9  # its own weights were replaced

    res = run(
        *argv, "-o", str(tmp_path / "x.tif"), "--weights", f"hf://{ORG}/demo/nope.pt", env=env
    )
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]  # (after any plugin's load warning)
    assert last.startswith(f"geoserve: error: hf://{ORG}/demo/nope.pt: not in the cache at {cache}")
    assert f"`hf download {ORG}/demo nope.pt`" in last
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "x.tif").exists()
