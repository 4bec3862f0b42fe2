"""Runs once per registered model: dummy input -> patches -> model -> output raster."""

import numpy as np
import pytest

from geoserve import MODEL_REGISTRY, Engine, load_plugins
from geoserve.raster import open_raster
from tests.conftest import processors_of
from tests.stub_models import REFUSE_THEIR_DUMMY

load_plugins()
#: Models whose factory fetches published weights from the Hub itself (unreachable here):
#: each has its own test against a local Hub cache.
FROM_THE_HUB = {
    f"terramind-v1-{size}-generate": "tests/models/terramind/test_generate_hub.py"
    for size in ("tiny", "small", "base", "large")
}
MODELS = [
    name
    for name, spec in MODEL_REGISTRY.items()
    if not spec.weights_required and name not in REFUSE_THEIR_DUMMY and name not in FROM_THE_HUB
]


@pytest.mark.parametrize("name", MODELS)
def test_model_runs_on_its_dummy_input(name, tmp_path):
    engine = Engine(name)
    in_proc, out_proc = processors_of(name)  # (the engine's own: no overrides)
    dummy = in_proc.dummy_input(seed=1)
    inputs = [dummy] * in_proc.num_frames
    out = engine.generate_image([inputs], output_path=tmp_path)[0].raise_for_error()
    with open_raster(out.outputs.path) as result:
        info = result.info
        assert (info.height, info.width) == dummy.data.shape[1:]
        assert info.crs == dummy.profile["crs"]
        assert info.transform == dummy.profile["transform"]
        data = result.read_rows(0, info.height, list(range(info.count)))
    assert np.isfinite(data.astype(np.float64)).all()
    expected = out_proc.out_channels
    if out_proc.kind == "classes":
        assert info.count == 1
        assert int(data.max()) < expected
    elif expected is not None:
        assert info.count == expected
