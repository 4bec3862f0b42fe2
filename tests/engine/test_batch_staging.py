"""CPU batches are staged in reused buffers, and no batch overwrites an output still in use.

Models that hand back a view of their input (an identity, a channel slice) are the danger: a
staging buffer is reused only once nothing references the batch last staged in it. The
engine's results must equal batch size 1's for any batch size, including when an
out-of-memory error splits a batch and its halves' outputs are joined after both ran.
"""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
import torch
from torch import nn

from geoserve import Engine, GeoTiffPatcher, RawReassembler
from geoserve.engine import transfer


class ViewOf(nn.Module):
    """Its input's first two bands, as a view; out of memory above ``limit`` patches."""

    limit = 1 << 30

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("out of memory (simulated)")
        return x[:, :2]


class SplitsAboveTwo(ViewOf):
    limit = 2


@pytest.fixture
def scene(make_geotiff):
    rng = np.random.default_rng(7)
    data = (rng.random((3, 61, 45)) * 60000).astype("uint16")
    return make_geotiff(data=data)


def _output(model: str, scene, tmp_path, batch: int, **kwargs) -> np.ndarray:
    with Engine(model, max_batch_patches=batch, prefetch=False, **kwargs) as eng:
        path = eng.generate_image(scene, output_path=tmp_path / f"{model}-{batch}.tif")
    with rasterio.open(path.outputs.path) as src:
        return src.read()


@pytest.mark.parametrize("blend", ["none", "center", "mean", "cosine"])
def test_identity_results_do_not_depend_on_the_batch_size(blend, scene, tmp_path):
    stride = 16 if blend == "none" else 11
    kwargs = {"patch_size": 16, "stride": stride, "blend": blend}
    one = _output("identity", scene, tmp_path, 1, **kwargs)
    if blend in ("none", "center"):  # exact: the input itself
        with rasterio.open(scene) as src:
            np.testing.assert_array_equal(one, src.read().astype(np.float32))
    for batch in (3, 32):
        np.testing.assert_array_equal(_output("identity", scene, tmp_path, batch, **kwargs), one)


@pytest.mark.parametrize("model", [ViewOf, SplitsAboveTwo])
def test_a_view_of_the_input_survives_the_next_batch(model, register_model, scene, tmp_path):
    """Halves of a split batch are joined after both ran: the first half's must be its own."""
    patcher = GeoTiffPatcher(patch_size=16, stride=12, blend="cosine")
    name = register_model(f"test-view-{model.__name__.lower()}", model, patcher, RawReassembler())
    one = _output(name, scene, tmp_path, 1)
    for batch in (3, 32):
        np.testing.assert_array_equal(_output(name, scene, tmp_path, batch), one)


def test_a_staging_buffer_is_reused_only_once_its_batch_is_gone():
    staging = transfer.Staging()

    def batch(value: float, n: int = 4) -> list[np.ndarray]:
        return [np.full((2, 3, 3), value + i, np.float32) for i in range(n)]

    x = staging.stack(batch(0), None)
    first = x.data_ptr()
    kept = x[:, :1]  # a model's output that is a view of its input, still in use
    del x
    y = staging.stack(batch(10), None)
    second = y.data_ptr()
    assert second != first
    z = staging.stack(batch(20), None)  # both buffers in use: a new array
    assert z.data_ptr() not in (first, second)
    np.testing.assert_array_equal(kept.numpy(), np.stack(batch(0))[:, :1])  # untouched
    np.testing.assert_array_equal(z.numpy(), np.stack(batch(20)))
    del y, z
    assert staging.stack(batch(30, 2), None).data_ptr() == second  # free again: reused
    del kept
    again = staging.stack(batch(40, 3), None)
    assert again.data_ptr() == first
    np.testing.assert_array_equal(again.numpy(), np.stack(batch(40, 3)))
    mixed = [np.zeros((2, 3, 3), np.float32), np.zeros((2, 3, 3), np.float64)]
    assert staging.stack(mixed, None).dtype == torch.float64  # promoted, as np.stack does
