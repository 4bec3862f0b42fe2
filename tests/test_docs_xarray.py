"""docs/xarray.md's notebook-style example: its Python blocks, run in order as written.

They name the bundled scene by its repository path; here that path holds its 512 x 512 corner
(bands and names kept), so the example runs in seconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import rasterio

import geoserve.xarray
from tests.conftest import write_bundled_corner

ROOT = Path(__file__).resolve().parents[1]


def test_xarray_md_example_runs_as_written(tmp_path, monkeypatch, capsys):
    write_bundled_corner(tmp_path, 512)
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "xarray.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    assert len(blocks) == 2
    ns: dict = {}
    try:
        for block in blocks:
            exec(compile(block, "xarray.md", "exec"), ns)
    finally:
        geoserve.xarray.close_engines()
    printed = capsys.readouterr().out
    assert "('band', 'y', 'x') (13, 512, 512) Array" in printed  # a lazy Dask cube
    assert "water: " in printed
    ds, ndwi = ns["ds"], ns["ndwi"]
    assert list(ds.data_vars) == ["classes", "confidence"]
    with rasterio.open(tmp_path / "water_classes.tif") as src:  # the GeoTIFF it wrote
        assert src.crs == ds.rio.crs
        assert src.transform == ds.rio.transform()
        assert (src.read(1) == ds["classes"].values).all()
    probs = ndwi["probabilities"].values
    assert probs.shape == (2, 384, 512)
    assert (ndwi["classes"].values == np.argmax(probs, axis=0)).all()
