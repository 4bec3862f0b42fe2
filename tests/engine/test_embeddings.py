"""The embeddings kinds: the encoder's tokens on the token grid, and one pooled row per patch."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import rasterio
import shapely
import torch
import torch.nn.functional as F  # noqa: N812
from affine import Affine
from rasterio.windows import Window
from torch import nn

from geoserve import Engine, GeoTiffPatcher, RawReassembler
from geoserve.errors import ConfigError
from geoserve.models.demo import demo_water
from geoserve.models.prithvi.variants import S2_L1C_PRITHVI_INDICES, V2_MEAN, V2_STD
from geoserve.raster.grid import reflect_indices
from tests.conftest import LAKE, read

TOKEN = 4


class PooledTokens(nn.Module):
    """Returns its input; its "tokens" are the input average-pooled over 4 x 4 pixels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_with_tokens(
        self, x: torch.Tensor, *, layer: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x, F.avg_pool2d(x, TOKEN)


def _pooled_model(register_model, blend: str, stride: int) -> str:
    name = f"pooled-{blend}-{stride}"
    patcher = GeoTiffPatcher(patch_size=16, stride=stride, blend=blend)
    return register_model(name, PooledTokens, patcher, RawReassembler(), token_size=TOKEN)


def _pooled_by_hand(image: np.ndarray) -> np.ndarray:
    """The whole image reflected out to whole tokens (as patches are filled), then pooled."""
    _, h, w = image.shape
    th, tw = -(-h // TOKEN), -(-w // TOKEN)
    rows, cols = reflect_indices(0, th * TOKEN, h), reflect_indices(0, tw * TOKEN, w)
    full = image[:, rows][:, :, cols].astype(np.float64)
    return full.reshape(image.shape[0], th, TOKEN, tw, TOKEN).mean(axis=(2, 4))


@pytest.mark.parametrize(
    ("blend", "stride"), [("none", 16), ("center", 8), ("mean", 8), ("cosine", 8)]
)
@pytest.mark.parametrize(("height", "width"), [(37, 50), (8, 8), (5, 70), (64, 48)])
def test_tokens_that_follow_position_give_the_whole_images_pooled_map(
    register_model, make_geotiff, tmp_path, blend, stride, height, width
):
    model = _pooled_model(register_model, blend, stride)
    src = make_geotiff(bands=2, height=height, width=width)
    with Engine(model, output_kind=["raw", "embeddings"], max_batch_patches=5) as engine:
        result = engine.generate_image(src, output_path=tmp_path / "out")
    tokens, profile = read(result.outputs_by_kind["embeddings"].path)
    image, source = read(src)
    assert tokens.shape == (2, -(-height // TOKEN), -(-width // TOKEN))
    np.testing.assert_allclose(tokens, _pooled_by_hand(image), rtol=1e-6)
    assert profile["transform"] == source["transform"] @ Affine.scale(TOKEN)
    assert profile["crs"] == source["crs"]
    raw = read(result.outputs_by_kind["raw"].path)[0]  # the pixel kind beside it, as always
    np.testing.assert_allclose(raw, image, rtol=0 if blend in ("none", "center") else 1e-6)


def test_tokens_are_nodata_where_every_pixel_under_them_is(register_model, make_geotiff, tmp_path):
    model = _pooled_model(register_model, "center", 8)
    data = np.arange(1, 1 + 40 * 40, dtype="uint16").reshape(1, 40, 40)
    data[:, :10, :10] = 0  # tokens (0..1, 0..1) all nodata, token row/col 2 partly
    src = make_geotiff(data=data, nodata=0)
    with Engine(model, output_kind="embeddings") as engine:
        tokens, profile = read(
            engine.generate_image(src, output_path=tmp_path / "e.tif").outputs.path
        )
    nan = np.isnan(tokens[0])
    assert nan[:2, :2].all()
    assert nan.sum() == 4
    assert np.isnan(profile["nodata"])


def test_patch_embeddings_rows_tile_the_input(register_model, make_geotiff, tmp_path):
    model = _pooled_model(register_model, "center", 8)
    src = make_geotiff(bands=2, height=37, width=50)
    with Engine(model, output_kind="patch-embeddings") as engine:
        result = engine.generate_image(src, output_path=tmp_path / "p.parquet")
    table = pq.read_table(result.outputs.path)
    assert table.num_rows == result.outputs.count == result.num_patches == 5 * 7
    geoms = shapely.from_wkb(table["geometry"].to_numpy(zero_copy_only=False))
    with rasterio.open(src) as ds:
        pixel = abs(ds.transform.a * ds.transform.e)
        bounds = shapely.box(*ds.bounds)
    assert shapely.area(geoms).sum() == pytest.approx(37 * 50 * pixel, rel=1e-12)
    assert shapely.union_all(geoms).equals(bounds)  # the cores tile the input, no overlap
    geo = json.loads(table.schema.metadata[b"geo"])
    assert geo["columns"]["geometry"]["crs"]["id"]["code"] == 32633
    assert table.schema.field("embedding").type.list_size == 2
    # patch (0, 0): the mean of its 16 x 16 pixels, the first 4 reflected (margin 4)
    image = read(src)[0].astype(np.float64)
    rows, cols = reflect_indices(-4, 16, 37), reflect_indices(-4, 16, 50)
    first = table.filter(pq.ParquetFile(result.outputs.path).read().column("row").to_numpy() == 0)
    vector = dict(zip(first["col"].to_pylist(), first["embedding"].to_pylist(), strict=True))[0]
    np.testing.assert_allclose(vector, image[:, rows][:, :, cols].mean(axis=(1, 2)), rtol=1e-6)


def _lake_square(tmp_path, size: int = 224) -> str:
    """A size x size corner of the bundled lake scene (13 bands, its georeferencing)."""
    path = tmp_path / "square.tif"
    with rasterio.open(LAKE) as src:
        window = Window(600, 200, size, size)
        profile = {**src.profile, "width": size, "height": size}
        profile["transform"] = src.window_transform(window)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(src.read(window=window))
    return str(path)


@pytest.mark.parametrize("layer", [-1, 0])
def test_demo_embeddings_are_its_encoders_tokens(tmp_path, layer):
    square = _lake_square(tmp_path)
    kwargs = {"patch_size": 224, "stride": 224, "blend": "none", "embedding_layer": layer}
    with Engine("demo-water", output_kind=["classes", "embeddings"], **kwargs) as engine:
        result = engine.generate_image(square, output_path=tmp_path / "demo")
    tokens, profile = read(result.outputs_by_kind["embeddings"].path)
    with rasterio.open(square) as src:
        bands = src.read([i + 1 for i in S2_L1C_PRITHVI_INDICES]).astype(np.float32)
        assert profile["transform"] == src.transform @ Affine.scale(16)
    mean, std = np.array(V2_MEAN, np.float32), np.array(V2_STD, np.float32)
    x = torch.from_numpy((bands - mean[:, None, None]) / std[:, None, None])[None]
    with torch.inference_mode():
        features = demo_water().encoder.forward_features(x)
    by_hand = features[layer][0, 1:].T.reshape(128, 14, 14).numpy()
    assert tokens.shape == (128, 14, 14)
    np.testing.assert_allclose(tokens, by_hand, rtol=1e-4, atol=1e-5)


def test_embeddings_refused_where_they_cannot_be_made(tmp_path):
    with pytest.raises(ConfigError, match=r"'identity' cannot produce 'embeddings'.*offers raw$"):
        Engine("identity", output_kind="embeddings")
    with pytest.raises(ConfigError, match=r"multiples of the model's token size \(16\)"):
        Engine("demo-water", output_kind="embeddings", patch_size=200, stride=200, blend="none")
    with pytest.raises(ConfigError, match="embedding_layer 5: the encoder has 2 blocks"):
        Engine("demo-water", output_kind="embeddings", embedding_layer=5)
    square = _lake_square(tmp_path, 100)
    sizes, values = [], []
    for dtype in ("float32", "float16"):
        with Engine("demo-water", output_kind="embeddings", embedding_dtype=dtype) as engine:
            out = engine.generate_image(square, output_path=tmp_path / f"{dtype}.tif").outputs
        assert (out.width, out.height, out.count) == (7, 7, 128)
        sizes.append(out.path.stat().st_size)
        values.append(read(out.path)[0])
    assert sizes[1] < 0.7 * sizes[0]  # half floats
    np.testing.assert_allclose(values[1], values[0], rtol=2e-3, atol=1e-4)
