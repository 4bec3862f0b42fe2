"""A tile's cut-out gives, over the tile, exactly the whole scene's prediction (any blend)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from affine import Affine
from rasterio.crs import CRS
from torch import nn

from geoserve import Engine, RasterArray
from geoserve.processors import GeoTiffPatcher, RawReassembler
from geoserve.tiles.plan import SceneGeometry, plan_tile

UTM = CRS.from_epsg(32633)


class PatchMean(nn.Module):
    """Each output pixel depends on the whole patch (a global receptive field, like a ViT)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :2] * 2 - x.mean(dim=(1, 2, 3), keepdim=True)


@pytest.mark.parametrize("blend", ["center", "mean", "cosine"])
def test_the_cut_reproduces_the_whole_scene_over_the_tile(register_model, blend):
    name = register_model(
        f"test-patch-mean-{blend}",
        PatchMean,
        GeoTiffPatcher(patch_size=32, stride=24, blend=blend),
        RawReassembler(),
    )
    rng = np.random.default_rng(3)
    height, width = 157, 203
    data = rng.integers(0, 1000, (3, height, width)).astype(np.float32)
    # 10 m pixels in UTM 33N near 52 N: tiles of zoom 15 are about 60 x 60 pixels
    transform = Affine(10.0, 0, 380000.0, 0, -10.0, 5810000.0)
    profile = {"crs": UTM, "transform": transform}
    engine = Engine(name, prefetch=False, warmup=False)
    full = engine.generate_image(RasterArray(data, profile), out_format="tensor")
    full_values = full.outputs.tensor.numpy()
    geometry = SceneGeometry("s", UTM, transform, width, height)
    checked = 0
    tiles = [(15, 17588, 10760), (15, 17590, 10761), (15, 17591, 10762), (16, 35180, 21522)]
    for z, x, y in tiles:
        plan = plan_tile(geometry, z, x, y, 32, 24)
        if plan is None:
            continue
        c = plan.cut
        assert c.row_off % 24 == 0  # on the scene's patch grid
        assert c.col_off % 24 == 0
        r0, c0 = int(c.row_off), int(c.col_off)
        cut = data[:, r0 : r0 + int(c.height), c0 : c0 + int(c.width)]
        cut_profile = {"crs": UTM, "transform": transform @ Affine.translation(c0, r0)}
        out = engine.generate_image(RasterArray(cut, cut_profile), out_format="tensor")
        rows, cols = plan.inner_in_cut
        i = plan.inner
        want = full_values[
            :,
            int(i.row_off) : int(i.row_off + i.height),
            int(i.col_off) : int(i.col_off + i.width),
        ]
        np.testing.assert_allclose(out.outputs.tensor.numpy()[:, rows, cols], want, atol=1e-4)
        checked += 1
    assert checked == len(tiles)
