"""Speed options: torch.compile, automatic batch size, out-of-memory back-off."""

from __future__ import annotations

import numpy as np
import pytest

from geoserve import Engine
from geoserve.errors import ConfigError
from tests import stub_models
from tests.stub_models import OOM_ABOVE


def test_out_of_memory_halves_the_batch_and_loses_nothing(make_geotiff, spy_model):
    src = make_geotiff(bands=2, height=70, width=90)
    model, seen = spy_model("test-oom")
    with Engine(model, max_batch_patches=1) as small:
        expected = small.generate_image(src, out_format="tensor").outputs.tensor
    with Engine(model, max_batch_patches=16) as engine:
        out = engine.generate_image(src, out_format="tensor").outputs.tensor
        assert engine.max_batch_patches <= OOM_ABOVE
        # later batches fit from the start
        assert max(len(batch) for batch in seen[-5:]) <= OOM_ABOVE
    assert out.equal(expected)


def test_out_of_memory_on_one_patch_fails_the_request_alone(make_geotiff, monkeypatch):
    src = make_geotiff(bands=2, height=30, width=30)
    with Engine("test-oom", max_batch_patches=2) as engine:
        monkeypatch.setattr(stub_models, "OOM_ABOVE", 0)
        result = engine.generate_image([src], out_format="tensor")[0]
        assert result.error is not None
        assert "out of memory" in str(result.error)
        monkeypatch.setattr(stub_models, "OOM_ABOVE", 3)
        assert engine.generate_image(src, out_format="tensor").ok  # the engine carries on


def test_auto_batch_size_on_cpu():
    with Engine("test-seg", max_batch_patches="auto") as engine:
        assert engine.max_batch_patches == 8
    with pytest.raises(ConfigError, match="'auto'"):
        Engine("test-seg", max_batch_patches="big")


def test_compiled_model_gives_the_same_output(make_geotiff):
    src = make_geotiff(bands=3, height=45, width=37)  # last batch is partial: padded
    with Engine("test-seg", max_batch_patches=4) as plain:
        ref = plain.generate_image(src, out_format="tensor").outputs.tensor
    with Engine("test-seg", max_batch_patches=4, compile=True, compile_backend="eager") as compiled:
        assert compiled.compiled
        out = compiled.generate_image(src, out_format="tensor").outputs.tensor
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
