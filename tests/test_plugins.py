"""Plugin discovery through real entry points, and the docs/plugins.md example."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_plugin(root: Path, dist: str, module: str, body: str) -> None:
    """A minimal installed distribution (a .dist-info with entry_points.txt) on a path."""
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[geoserve.plugins]\n{dist} = {module}:register\n")


def run_cli(path: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "geoserve", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(path), **(env or {})},
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
    assert "failed to load" in res.stderr


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


def test_docs_plugin_example_runs():
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/plugins.md lost its example"
    res = subprocess.run(
        [sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "patches;" in res.stdout
