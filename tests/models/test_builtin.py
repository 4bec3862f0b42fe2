import numpy as np
import torch

from geoserve.models.builtin import Identity, NdwiWater


def test_ndwi_water_argmax_is_ndwi_above_zero():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.uniform(0.01, 0.5, size=(3, 2, 8, 8)).astype(np.float32))
    logits = NdwiWater()(x)
    ndwi = (x[:, 0] - x[:, 1]) / (x[:, 0] + x[:, 1])
    assert logits.shape == (3, 2, 8, 8)
    assert torch.equal(logits.argmax(1) == 1, ndwi > 0)


def test_identity_returns_input():
    x = torch.rand(2, 5, 4, 4)
    assert torch.equal(Identity()(x), x)
