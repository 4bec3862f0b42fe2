"""``--batch-size auto --compile``: one compiled graph for warm-up, every batch and every scene.

Dynamo's own counters count the graphs it made (``unique_graphs``); the ``eager`` backend runs
them without code generation, so the test is fast on a CPU. A partial batch is padded to the
compiled size, and the outputs must not depend on that padding.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from geoserve import Engine


@pytest.fixture
def dynamo() -> Iterator[None]:
    """Dynamo's caches and counters emptied before and after the test."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.usefixtures("dynamo")
def test_auto_batch_compiles_one_graph_for_every_batch_and_scene(make_geotiff):
    # test-seg: patch 16, stride 12; 12 and 18 patches: last batches of 4 and 2 (padded)
    scenes = [
        make_geotiff(bands=3, height=45, width=25),
        make_geotiff(bands=3, height=61, width=25),
    ]
    with Engine("test-seg", max_batch_patches=8) as plain:  # no padding, no compiling
        expected = [plain.generate_image(s, out_format="tensor").outputs.tensor for s in scenes]
    assert graphs() == 0
    with Engine("test-seg", max_batch_patches="auto", compile=True, compile_backend="eager") as eng:
        assert eng.max_batch_patches == 8
        assert graphs() == 1  # warm-up compiled the graph, at the final batch size
        one_by_one = [eng.generate_image(s, out_format="tensor") for s in scenes]
        together = eng.generate_image(scenes, out_format="tensor")  # two scenes in one batch
        assert graphs() == 1
        assert counters["frames"]["ok"] == 1  # one frame compiled, never recompiled
    assert [r.num_patches for r in one_by_one] == [12, 18]
    for want, a, b in zip(expected, one_by_one, together, strict=True):
        np.testing.assert_array_equal(a.outputs.tensor.numpy(), want.numpy())
        np.testing.assert_array_equal(b.outputs.tensor.numpy(), want.numpy())


@pytest.mark.usefixtures("dynamo")
def test_fixed_batch_compiles_one_graph(make_geotiff):
    scene = make_geotiff(bands=3, height=45, width=25)  # 12 patches: 5 + 5 + 2 (padded)
    with Engine("test-seg", max_batch_patches=5, compile=True, compile_backend="eager") as eng:
        eng.generate_image(scene, out_format="tensor")
        eng.generate_image(scene, out_format="tensor")
    assert graphs() == 1


@pytest.mark.gpu
@pytest.mark.usefixtures("dynamo")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_batch_memory_probe_compiles_nothing_on_cuda(make_geotiff):
    # on CUDA "auto" measures memory per patch with a forward pass of 4: on the plain module
    scenes = [
        make_geotiff(bands=3, height=45, width=25),
        make_geotiff(bands=3, height=61, width=25),
    ]
    with Engine(
        "test-seg", device="cuda", max_batch_patches="auto", compile=True, compile_backend="eager"
    ) as eng:
        assert graphs() == 1
        for scene in scenes:
            eng.generate_image(scene, out_format="tensor")
        eng.generate_image(scenes, out_format="tensor")
    assert graphs() == 1
