"""Plugin discovery through real entry points, and the docs/plugins.md example."""

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import rasterio

from tests.conftest import write_bundled_corner
from tests.multimodal_scenes import write_s1, write_s2

ROOT = Path(__file__).resolve().parents[1]


def make_plugin(root: Path, dist: str, module: str, body: str) -> None:
    """A minimal installed distribution (a .dist-info with entry_points.txt) on a path."""
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[geoserve.plugins]\n{dist} = {module}:register\n")


def run_cli(path: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    pythonpath = os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "geoserve", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
        cwd=cwd,
        timeout=120,
    )


PLUGIN = """
    import torch
    from geoserve import (INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY, GeoTiffPatcher,
                          RawReassembler)

    @MODEL_REGISTRY.register_model("plugged-double", description="doubles its input")
    @INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16))
    @OUTPUT_REGISTRY.register_output_processor(RawReassembler())
    class Double(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    def register():
        pass
"""


def test_entry_point_plugin_is_found_and_runs(tmp_path, make_geotiff):
    make_plugin(tmp_path, "geoserve_double", "geoserve_double", PLUGIN)
    res = run_cli(tmp_path, "models")
    assert res.returncode == 0, res.stderr
    assert any(line.startswith("plugged-double") for line in res.stdout.splitlines())
    src = make_geotiff(bands=2, height=20, width=21)
    out = tmp_path / "o.tif"
    res = run_cli(tmp_path, "predict", str(src), "-o", str(out), "--model", "plugged-double")
    assert res.returncode == 0, res.stderr
    import rasterio

    with rasterio.open(out) as a, rasterio.open(src) as b:
        assert (a.read() == 2 * b.read().astype("float32")).all()


def test_broken_plugin_is_skipped_others_load(tmp_path):
    make_plugin(tmp_path, "geoserve_double", "geoserve_double", PLUGIN)
    make_plugin(tmp_path, "geoserve_broken", "geoserve_broken", "raise ImportError('boom')\n")
    res = run_cli(tmp_path, "models")
    assert res.returncode == 0
    assert "plugged-double" in res.stdout
    assert "geoserve_broken" in res.stderr
    assert "failed to load, skipped: ImportError('boom')" in res.stderr
    assert "Traceback" not in res.stderr  # (with --debug it is shown)


def test_allow_list_rejects_missing_plugin(tmp_path):
    make_plugin(tmp_path, "geoserve_double", "geoserve_double", PLUGIN)
    res = run_cli(tmp_path, "models", env={"GEOSERVE_PLUGINS": "not_there"})
    assert res.returncode == 1
    assert "plugin(s) not_there requested but not installed" in res.stderr
    assert "geoserve_double" in res.stderr
    res = run_cli(tmp_path, "models", env={"GEOSERVE_PLUGINS": "builtin"})
    assert res.returncode == 0
    assert "plugged-double" not in res.stdout
    assert "ndwi-water" in res.stdout


def plugins_text() -> str:
    return (ROOT / "docs" / "plugins.md").read_text()


def plugin_doc() -> list[dict[str, list[str]]]:
    """docs/plugins.md's models: each one's module block, then its Python blocks and CLI lines."""
    text = plugins_text()
    models: list[dict[str, list[str]]] = []
    for lang, body in re.findall(r"```(python|bash)\n(.*?)```", text, flags=re.S):
        if lang == "python" and "register_model(" in body:
            models.append({"module": [body], "run": [], "cli": []})
        elif lang == "python":
            models[-1]["run"].append(body)
        elif "geoserve predict" in body:
            models[-1]["cli"].append(body.replace("\\\n", " "))
    return models


def test_docs_plugin_examples_run_as_scripts(tmp_path):
    """Each model's blocks, run as one script from a repository root (a corner of its scene)."""
    models = plugin_doc()
    assert len(models) >= 3, "docs/plugins.md lost its examples"
    assert all(m["run"] and m["cli"] for m in models)
    write_bundled_corner(tmp_path)
    bright, change, fusion = models[0], models[1], models[2]
    script = "\n".join(
        bright["module"] + bright["run"] + change["module"] + change["run"]
        + fusion["module"] + fusion["run"]
    )  # fmt: skip
    script += textwrap.dedent(
        f"""
        # checks the docs do not show: the values the documented behaviour gives
        assert change.shape == (2, 256, 256)
        red = profile["descriptions"].index("B4")
        expected = (july[red].astype("float32") - june[red]) * 1e-4 / 30  # June 1 to July 1
        assert torch.allclose(change[0], torch.from_numpy(expected), rtol=1e-4, atol=1e-7)
        import rasterio
        with rasterio.open("dark_water.tif") as dst:
            assert dst.dtypes[0] == "uint8" and dst.tags()["CLASS_NAMES"] == "land,water"
            assert dst.colormap(1)[1][:3] == (30, 90, 200)
        # the multimodal one: on the S2 grid, water on the disc (a quarter of the side across)
        for name in ("fused_water.tif", "optical_water.tif"):
            with rasterio.open(name) as dst, rasterio.open("s2.tif") as s2:
                assert (dst.crs, dst.transform, dst.shape) == (s2.crs, s2.transform, s2.shape)
                assert dst.tags()["CLASS_NAMES"] == "land,water"
                water = (dst.read(1) == 1).mean()
            assert abs(water - 3.14159 / 16) < 0.01, (name, water)
        print("{SENTINEL}")
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    res = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,  # the multimodal example imports the toy scenes from tests/
    )
    assert res.returncode == 0, res.stderr
    assert "patches;" in res.stdout
    assert SENTINEL in res.stdout


SENTINEL = "docs example checked"


def test_docs_plugin_examples_as_installed_plugins(tmp_path):
    """Each model's module block as an installed plugin, run by the CLI line the docs give."""
    models = plugin_doc()
    root = tmp_path / "repo"
    scene = write_bundled_corner(root)
    for i, model in enumerate(models):
        make_plugin(tmp_path, f"doc_plugin_{i}", f"doc_plugin_{i}", model["module"][0])
        with (tmp_path / f"doc_plugin_{i}.py").open("a") as f:
            f.write("\n\ndef register():\n    pass\n")
    for model in models:
        for line in model["cli"]:
            args = shlex.split(line)
            assert args[:2] == ["geoserve", "predict"]
            out = args[args.index("-o") + 1]
            for pair in [a for a in args if "=" in a]:  # -i NAME=FILE: the toy scenes
                name, file = pair.split("=", 1)
                if not (root / file).exists():
                    {"s2": write_s2, "s1": write_s1}[name](root / file)
            dates = [a for a in args[2:] if a.endswith(".tif") and a != out and "=" not in a]
            for k, name in enumerate(dates):  # made up: the scene, then 10 % brighter
                if (root / name).exists():
                    continue
                with rasterio.open(scene) as src:
                    profile, data = src.profile, src.read()
                    with rasterio.open(root / name, "w", **profile) as dst:
                        dst.write((data * (1 + 0.1 * k)).astype(data.dtype))
                        dst.descriptions = src.descriptions
            res = run_cli(tmp_path, *args[1:], cwd=root)
            assert res.returncode == 0, f"{line}\n{res.stderr}"
    with rasterio.open(root / "dark_water.tif") as dst:
        assert dst.tags()["CLASS_NAMES"] == "land,water"
    with rasterio.open(root / "change.tif") as dst, rasterio.open(scene) as src:
        assert dst.descriptions == ("red change per day", "nir change per day")
        red = src.read(src.descriptions.index("B4") + 1).astype("float64")
        expected = ((red * 1.1).astype("uint16") - red).astype("float32")
        # 2023-06-01 to 2023-07-01, from the file names: 30 days
        assert np.allclose(dst.read(1), expected * 1e-4 / 30, rtol=1e-4, atol=1e-7)
    with rasterio.open(root / "fused_water.tif") as dst, rasterio.open(root / "s2.tif") as s2:
        assert (dst.crs, dst.transform, dst.shape) == (s2.crs, s2.transform, s2.shape)
        assert abs((dst.read(1) == 1).mean() - np.pi / 16) < 0.01  # the water disc
    # what the page shows `geoserve info -i ...` print, it prints ("..." stands for lines)
    shown = re.search(r"```\n\$ (geoserve info -i [^\n]*)\n(.*?)```", plugins_text(), re.S)
    assert shown, "docs/plugins.md lost its `geoserve info -i` example"
    res = run_cli(tmp_path, *shlex.split(shown.group(1))[1:], cwd=root)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for line in shown.group(2).splitlines():
        if line.strip() and line != "...":
            assert line in lines, f"{line!r} not in:\n{res.stdout}"


def test_engine_runs_a_plugin_model_as_plugins_md_says(make_geotiff):
    """eval() once, forward passes under inference_mode, float32 input, first item of a tuple."""
    import torch

    from geoserve import (
        INPUT_REGISTRY,
        MODEL_REGISTRY,
        OUTPUT_REGISTRY,
        Engine,
        GeoTiffPatcher,
        RawReassembler,
    )

    seen = []

    @MODEL_REGISTRY.register_model("plugins-md-promises")
    @INPUT_REGISTRY.register_input_processor(GeoTiffPatcher(patch_size=16))
    @OUTPUT_REGISTRY.register_output_processor(RawReassembler())
    class Probe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)  # would zero half the values in training mode

        def forward(self, x):
            seen.append((self.training, torch.is_inference_mode_enabled(), x.dtype))
            return self.drop(x), "ignored"

    src = make_geotiff(bands=2, height=20, width=21)
    out = Engine("plugins-md-promises").generate_image(src, out_format="tensor").outputs.tensor
    assert seen
    assert set(seen) == {(False, True, torch.float32)}
    with rasterio.open(src) as ds:
        assert np.array_equal(out.numpy(), ds.read().astype("float32"))
