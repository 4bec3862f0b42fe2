"""The CPU fast path: int8 quantisation and bf16 on a CPU, through ``Engine``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tests.stub_models  # noqa: F401  (registers the test-* models)
from geoserve import Engine, EngineConfig
from geoserve.engine.cpu_inference import (
    PerPatchLinear,
    SlowOptionWarning,
    native_reduced_precision,
)
from geoserve.errors import ConfigError
from tests.conftest import LAKE


def _logits(**options: object) -> np.ndarray:
    with Engine("demo-water", output_kind=["raw"], prefetch=False, **options) as engine:
        out = engine.generate_image(LAKE, out_format="tensor").outputs
        return out.tensor.numpy()


@pytest.fixture(scope="module")
def fp32_logits() -> np.ndarray:
    return _logits(max_batch_patches=8)


def test_int8_agrees_with_float32_and_does_not_depend_on_the_batch(fp32_logits):
    one = _logits(quantize="int8", max_batch_patches=1)
    eight = _logits(quantize="int8", max_batch_patches=8)
    # every patch is quantised by its own values: batch size (and, with cross-request
    # batching, other requests' patches) leave its result alone up to float rounding
    assert np.abs(one - eight).max() < 1e-4
    assert np.abs(one - fp32_logits).max() > 1e-3  # it did run in int8
    agreement = (one.argmax(0) == fp32_logits.argmax(0)).mean()
    assert agreement >= 0.995


def test_int8_quantises_every_linear_layer_and_only_those():
    with Engine("demo-water", quantize="int8", warmup=False) as engine:
        modules = list(engine.model.modules())
    assert not any(type(m) is torch.nn.Linear for m in modules)
    n_wrapped = sum(isinstance(m, PerPatchLinear) for m in modules)
    assert n_wrapped == 2 * 4 + 0  # 2 blocks x (qkv, proj, fc1, fc2)
    assert any(isinstance(m, torch.nn.ConvTranspose2d) for m in modules)  # convs stay float


def test_int8_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="quantize: int8 is a CPU path.*bf16"):
        EngineConfig.build(quantize="int8", device="cuda")
    with pytest.raises(ConfigError, match="quantize: int8 runs .* dtype bf16"):
        EngineConfig.build(quantize="int8", dtype="bf16")
    with pytest.raises(ConfigError, match="'test-seg' has no linear layers"):
        Engine("test-seg", quantize="int8")


class SequenceFirst(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(3, 1, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_int8_refuses_attention_layers_it_cannot_run_per_patch(register_model):
    from geoserve.processors import GeoTiffPatcher, RawReassembler

    name = register_model(
        "test-seq-first", SequenceFirst, GeoTiffPatcher(patch_size=16), RawReassembler()
    )
    with pytest.raises(ConfigError, match="uses MultiheadAttention, TransformerEncoderLayer"):
        Engine(name, quantize="int8", warmup=False)
    assert EngineConfig.build(quantize="int8", dtype="fp32").quantize == "int8"


def test_accuracy_counts_what_the_candidate_could_not_compute(tmp_path):
    from geoserve.accuracy import compare_outputs
    from tests.conftest import write_geotiff

    ref = np.stack([np.full((8, 8), 1.0), np.zeros((8, 8))]).astype(np.float32)
    cand = ref.copy()
    cand[:, :, :4] = np.inf  # half of the pixels overflowed
    a = write_geotiff(tmp_path / "a.tif", ref)
    b = write_geotiff(tmp_path / "b.tif", cand)
    stats = compare_outputs(a, b, is_classes=True)
    assert stats["pixels"] == 64
    assert stats["nonfinite"] == 32
    assert stats["agreement"] == 0.5
    assert stats["max_abs"] == float("inf")


def test_bf16_on_a_cpu_warns_when_it_is_emulated():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Engine("demo-water", dtype="bf16", warmup=False).close()
    slow = [w for w in caught if issubclass(w.category, SlowOptionWarning)]
    if native_reduced_precision("bf16"):
        assert not slow
    else:
        assert len(slow) == 1
        assert "emulated" in str(slow[0].message)
        assert "--quantize int8" in str(slow[0].message)


def test_the_catalogue_says_which_models_were_validated_with_int8():
    from geoserve.catalog import footer_lines, model_entries

    entries = {e.name: e for e in model_entries()}
    assert entries["demo-water"].validated == ["int8"]
    assert entries["test-seg"].validated == []
    footer = "\n".join(footer_lines(list(entries.values()), 200))
    assert "--quantize int8 (CPU) validated on real data: demo-water\n" in footer
