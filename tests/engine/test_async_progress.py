"""AsyncEngine.progress: patches done out of all, rising while a request runs."""

from __future__ import annotations

import asyncio

import numpy as np

import tests.stub_models  # noqa: F401  (test-slow)
from geoserve import Engine, RasterArray, RequestSpec
from geoserve.engine.async_engine import AsyncEngine

PROFILE = {"crs": "EPSG:32633", "transform": (10, 0, 0, 0, -10, 0)}


def test_progress_rises_to_the_total_and_is_gone_after() -> None:
    engine = Engine("test-slow", max_batch_patches=1)
    ae = AsyncEngine(engine)
    raster = RasterArray(np.ones((3, 64, 64), np.float32), PROFILE)  # 16 patches of 16 px

    async def main() -> list[tuple[int, int] | None]:
        seen: list[tuple[int, int] | None] = []
        task = asyncio.create_task(
            ae.submit(RequestSpec(raster, request_id="p1", out_format="tensor"))
        )
        while not task.done():
            seen.append(ae.progress("p1"))
            await asyncio.sleep(0.02)
        assert (await task).error is None
        seen.append(ae.progress("p1"))
        return seen

    try:
        seen = asyncio.run(main())
    finally:
        ae.close()
    counted = [s for s in seen if s is not None]
    assert seen[-1] is None  # handed out: no longer tracked
    assert {total for _, total in counted} == {16}
    done = [d for d, _ in counted]
    assert done == sorted(done)
    assert any(0 < d < 16 for d in done), done
    assert ae.progress("never") is None
