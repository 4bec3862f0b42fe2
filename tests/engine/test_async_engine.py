"""AsyncEngine: admission bounds, batching wait, cancellation (no HTTP involved)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

from geoserve import Engine, GeoTiffPatcher, RasterArray, RawReassembler, RequestSpec
from geoserve.engine.async_engine import AsyncEngine
from geoserve.errors import PayloadTooLargeError, QueueFullError, RequestTimeoutError

PROFILE = {"crs": "EPSG:32633", "transform": (10, 0, 0, 0, -10, 0)}


def image(size: int, value: float = 1.0) -> RasterArray:
    return RasterArray(np.full((1, size, size), value, dtype=np.float32), PROFILE)


def make(model: str = "identity", **kwargs) -> tuple[AsyncEngine, list[int]]:
    sizes: list[int] = []
    engine = Engine(model, patch_size=8, stride=8, blend="none", max_batch_patches=4)
    return AsyncEngine(engine, on_batch=sizes.append, **kwargs), sizes


def test_results_match_offline():
    ae, _ = make()

    async def main():
        return await asyncio.gather(
            *(
                ae.submit(RequestSpec(image(s, s), request_id=f"r{s}", out_format="tensor"))
                for s in (5, 17, 30)
            )
        )

    try:
        outs = asyncio.run(main())
    finally:
        ae.close()
    for s, out in zip((5, 17, 30), outs, strict=True):
        assert out.ok
        np.testing.assert_array_equal(out.outputs.tensor.numpy(), np.full((1, s, s), s))


def test_max_wait_lets_later_patches_join_the_batch():
    ae, sizes = make(max_wait_ms=400)

    async def main():
        first = asyncio.create_task(
            ae.submit(RequestSpec(image(8), request_id="a", out_format="tensor"))
        )
        await asyncio.sleep(0.1)
        second = asyncio.create_task(
            ae.submit(RequestSpec(image(8), request_id="b", out_format="tensor"))
        )
        return await asyncio.gather(first, second)

    try:
        outs = asyncio.run(main())
    finally:
        ae.close()
    assert all(o.ok for o in outs)
    assert sizes == [2]  # one forward pass held both requests' patches


def test_without_wait_the_first_patch_runs_alone():
    ae, sizes = make(max_wait_ms=0)

    async def main():
        await ae.submit(RequestSpec(image(8), request_id="a", out_format="tensor"))
        await ae.submit(RequestSpec(image(8), request_id="b", out_format="tensor"))

    try:
        asyncio.run(main())
    finally:
        ae.close()
    assert sizes == [1, 1]


def test_admission_bounds():
    ae, _ = make(max_queued_patches=10, max_pixels=1500)

    async def main():
        with pytest.raises(QueueFullError, match="needs 16"):
            await ae.submit(RequestSpec(image(32), request_id="big", out_format="tensor"))
        with pytest.raises(PayloadTooLargeError, match="over the limit of 1500"):
            await ae.submit(RequestSpec(image(40), request_id="huge", out_format="tensor"))

    try:
        asyncio.run(main())
        assert ae.queued_patches == 0
    finally:
        ae.close()


def test_timeout_drops_request(monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0.05")
    ae, _ = make("test-slow")  # identity, 0.05 s a forward pass

    async def main():
        with pytest.raises(RequestTimeoutError):
            await ae.submit(
                RequestSpec(image(64), request_id="slow", out_format="tensor"), timeout=0.1
            )
        await asyncio.sleep(0.2)

    try:
        asyncio.run(main())
        assert ae.queued_patches == 0
        assert ae.in_flight == 0
    finally:
        ae.close()


def test_a_bug_in_output_processing_fails_the_request_not_the_loop(register_model):
    @dataclasses.dataclass(frozen=True)
    class BuggyOnLarge(RawReassembler):
        def finalize(self, data, valid, ctx):
            if (data > 100).any():  # a bug that only large values reach
                raise AttributeError("bug")
            return super().finalize(data, valid, ctx)

    class Echo(torch.nn.Module):
        def forward(self, x):
            return x

    model = register_model("test-buggy-output", Echo, GeoTiffPatcher(), BuggyOnLarge())
    ae, _ = make(model)

    async def main(value):
        return await ae.submit(
            RequestSpec(image(8, value), request_id=f"v{value}", out_format="tensor")
        )

    try:
        out = asyncio.run(asyncio.wait_for(main(1000.0), 10))
        assert out.error is not None
        assert "output processing failed" in str(out.error)
        again = asyncio.run(asyncio.wait_for(main(1.0), 10))
        assert again.ok
    finally:
        ae.close()
