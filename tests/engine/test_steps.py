"""Models whose patches take several steps: batched by step kind, reproducible, seamless.

``test-steps`` (tests/stub_models.py) returns its input exactly plus one band: its request's
scene noise field (:func:`geoserve.models.steps.noise_field`) plus 1 + 2 + 3 added by its
three "add" steps, each adding its own step index.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geoserve import Engine
from geoserve.errors import ConfigError, ModelExecutionError, ProcessorMismatchError
from geoserve.models.steps import SteppedModel, noise_field, patch_generator
from tests.conftest import processors_of, read
from tests.stub_models import STEPS_ADDED


def _expected_noise(seed: int, height: int, width: int) -> np.ndarray:
    return noise_field(seed, 0, (0, 0), (1, height, width)).numpy()[0] + STEPS_ADDED


def _scene(make_geotiff, height: int, width: int, value: int | None = None):
    if value is None:
        return make_geotiff(bands=2, height=height, width=width)
    return make_geotiff(data=np.full((2, height, width), value, np.uint16))


def test_steps_give_back_the_input_and_the_scene_noise(make_geotiff):
    path = _scene(make_geotiff, 37, 29)
    with Engine("test-steps", max_batch_patches=4) as engine:
        out = engine.generate_image(path, out_format="tensor", seed=7)
    data, _ = read(path)
    result = out.outputs.tensor.numpy()
    assert np.array_equal(result[:2], data.astype(np.float32))  # the input, exactly
    # overlapping patches start from the same noise where they overlap, so the blended
    # band equals the scene's field everywhere: no seams
    np.testing.assert_allclose(result[2], _expected_noise(7, 37, 29), rtol=0, atol=1e-5)


def test_outputs_do_not_depend_on_batch_size_or_other_requests(make_geotiff, tmp_path):
    path = _scene(make_geotiff, 40, 33)
    others = [_scene(make_geotiff, 20 + 3 * i, 25) for i in range(8)]
    with Engine("test-steps", max_batch_patches=1) as engine:
        alone = engine.generate_image(path, output_path=tmp_path / "alone.tif", seed=3)
    with Engine("test-steps", max_batch_patches=16) as engine:
        outs = engine.generate_image(
            [*others[:4], path, *others[4:]], output_path=tmp_path / "many", seed=3
        )
    among = outs[4]
    assert among.error is None
    assert Path(among.outputs.path).read_bytes() == Path(alone.outputs.path).read_bytes()


def test_a_batch_mixes_requests_at_different_steps(make_geotiff):
    a, b = _scene(make_geotiff, 16, 16), _scene(make_geotiff, 16, 16)
    # (rows read inline: a request's row is there when its turn comes)
    opts = {"patch_size": 16, "stride": 16, "blend": "none", "prefetch": False}
    with Engine("test-steps", max_batch_patches=4, **opts) as eng:
        model = eng.model
        model.calls.clear()  # (the warm-up's)
        eng.add_request(a, out_format="tensor", seed=1)
        eng.step()  # a: draw
        eng.step()  # a: add (step 1)
        eng.add_request(b, out_format="tensor", seed=2)
        results = list(eng.run_until_done())
    kinds = [(kind, steps, seeds) for kind, steps, seeds, _ in model.calls]
    assert kinds[:3] == [("draw", [0], [1]), ("add", [1], [1]), ("draw", [0], [2])]
    # then one batch holds a at step 2 and b at step 1, most advanced first
    assert kinds[3] == ("add", [2, 1], [1, 2])
    assert len(results) == 2
    for r in results:
        assert r.error is None
        assert r.outputs.tensor.shape == (3, 16, 16)


def test_patches_between_steps_stay_within_the_batch_cap(make_geotiff):
    paths = [_scene(make_geotiff, 50, 45) for _ in range(3)]
    with Engine("test-steps", max_batch_patches=5) as engine:
        model = engine.model
        model.calls.clear()
        outs = engine.generate_image(paths, out_format="tensor", seed=11)
    assert all(o.error is None for o in outs)
    assert model.live_max <= 5
    assert max(len(steps) for _, steps, _, _ in model.calls) <= 5
    for path, out in zip(paths, outs, strict=True):
        data, _ = read(path)
        assert np.array_equal(out.outputs.tensor[:2].numpy(), data.astype(np.float32))


def test_seed_decides_the_draws(make_geotiff):
    path = _scene(make_geotiff, 20, 20)
    with Engine("test-steps") as engine:
        one, two, again = (
            engine.generate_image(path, out_format="tensor", seed=s).outputs.tensor[2]
            for s in (1, 2, 1)
        )
    assert torch.equal(one, again)
    assert not torch.allclose(one, two)


def test_a_step_that_fails_fails_its_request_alone(make_geotiff):
    good, other = _scene(make_geotiff, 30, 30), _scene(make_geotiff, 30, 30, value=60_000)
    poisoned = make_geotiff(data=np.full((2, 30, 30), 2e5, np.float32))
    with Engine("test-steps", max_batch_patches=8) as engine:
        outs = engine.generate_image([good, poisoned, other], out_format="tensor")
        assert isinstance(outs[1].error, ModelExecutionError)
        assert "poisoned patch at step 2" in str(outs[1].error)
        assert outs[0].error is None
        assert outs[2].error is None
        again = engine.generate_image(good, out_format="tensor")  # the engine still serves
    assert torch.equal(again.outputs.tensor, outs[0].outputs.tensor)


def test_aborting_between_steps_drops_the_request_alone(make_geotiff):
    a, b = _scene(make_geotiff, 40, 40), _scene(make_geotiff, 40, 40)
    with Engine("test-steps", max_batch_patches=4) as engine:
        ra = engine.add_request(a, out_format="tensor")
        rb = engine.add_request(b, out_format="tensor")
        engine.step()
        engine.step()
        assert engine.abort_request(ra)
        results = {r.request_id: r for r in engine.run_until_done()}
        assert ra not in results
        assert results[rb].error is None
        assert not engine.has_unfinished()
    data, _ = read(b)
    assert np.array_equal(results[rb].outputs.tensor[:2].numpy(), data.astype(np.float32))


def test_compile_is_refused_for_a_stepped_model():
    with pytest.raises(ConfigError, match="several steps per patch"):
        Engine("test-steps", compile=True)


def test_a_seed_out_of_range_is_refused(make_geotiff):
    with Engine("test-steps") as engine, pytest.raises(ConfigError, match="seed"):
        engine.generate_image(_scene(make_geotiff, 16, 16), out_format="tensor", seed=-1)


@settings(max_examples=40, deadline=None)
@given(
    r=st.integers(-200, 200),
    c=st.integers(-200, 200),
    h=st.integers(1, 90),
    w=st.integers(1, 90),
    dr=st.integers(0, 89),
    dc=st.integers(0, 89),
)
def test_noise_field_is_the_same_at_the_same_place(r, c, h, w, dr, dc):
    big = noise_field(5, 1, (r, c), (2, h, w))
    dr, dc = min(dr, h - 1), min(dc, w - 1)
    small = noise_field(5, 1, (r + dr, c + dc), (2, h - dr, w - dc))
    assert torch.equal(big[:, dr:, dc:], small)


def test_noise_fields_of_other_seeds_streams_and_scales_differ():
    base = noise_field(1, 0, (0, 0), (1, 32, 32))
    assert not torch.equal(base, noise_field(2, 0, (0, 0), (1, 32, 32)))
    assert not torch.equal(base, noise_field(1, 1, (0, 0), (1, 32, 32)))
    tokens = noise_field(1, 0, (32, 16), (1, 4, 4), scale=16, dist="uniform")
    assert torch.equal(
        tokens, noise_field(1, 0, (0, 0), (1, 8, 8), scale=16, dist="uniform")[:, 2:6, 1:5]
    )
    assert float(tokens.min()) >= 0
    assert float(tokens.max()) < 1
    with pytest.raises(ValueError, match="multiple of the scale"):
        noise_field(1, 0, (3, 0), (1, 4, 4), scale=16)
    a = torch.randn(4, generator=patch_generator(1, (0, 16), step=2))
    assert torch.equal(a, torch.randn(4, generator=patch_generator(1, (0, 16), step=2)))
    assert not torch.equal(a, torch.randn(4, generator=patch_generator(1, (0, 16), step=3)))


def test_a_stepped_model_without_steps_is_refused_at_start_up(register_model):
    class NoSteps(SteppedModel):
        def plan(self) -> tuple[str, ...]:
            return ()

    name = register_model("test-no-steps", NoSteps, *processors_of("test-steps"))
    with pytest.raises(ProcessorMismatchError, match="plan\\(\\) names none"):
        Engine(name)
