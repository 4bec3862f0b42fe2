"""JobRunner leases: runners sharing a store never take each other's live jobs, and take over a
job whose runner went quiet, without the quiet one's late reports or clean-up touching it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import JobStoreError
from geoserve.jobs import JobStore
from geoserve.jobs.runner import JobRunner
from geoserve.schemas import ImageOutput, ImageRequestOutput

LEASE_S = 2.5  # the shortest a runner takes is just over 2 s (four reports)
SPEC = RequestSpec("/data/scene.tif").to_json()


class Worker:
    """What one runner's ``execute`` does: writes ``out.tif`` naming itself once let go."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def execute(self, spec: RequestSpec, directory: Path) -> ImageRequestOutput:
        self.started.set()
        await self.release.wait()
        path = directory / "out.tif"
        path.write_text(self.name)
        out = ImageOutput("path", 8, 8, 1, "uint8", kind="raw", path=path)
        return ImageRequestOutput(spec.request_id or "", True, out, outputs_by_kind={"raw": out})


class QuietStore:
    """A store whose progress reports fail from ``quiet`` on (a runner cut off from it)."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self.quiet = False

    def progress(self, *args: Any, **kwargs: Any) -> bool:
        if self.quiet:
            raise JobStoreError("the job store is unreachable from this runner")
        return self._store.progress(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def runner(store: Any, out: Path, worker: Worker) -> JobRunner:
    return JobRunner(
        store,
        out,
        worker.execute,
        lambda job_id: None,
        lambda exc: {"type": type(exc).__name__, "detail": str(exc)},
        lease_s=LEASE_S,
    )


async def until(check: Callable[[], bool], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_live_runners_job_is_never_taken_a_quiet_ones_is(
    open_store: Callable[..., JobStore], tmp_path: Path
) -> None:
    async def scenario() -> None:
        store_a = QuietStore(open_store())
        store_b = open_store()
        a, b = Worker("a"), Worker("b")
        first = store_b.create("p", SPEC).job_id
        runner_a = runner(store_a, tmp_path, a)
        await runner_a.start()
        await asyncio.wait_for(a.started.wait(), 10)  # a claimed it (b not started yet)
        runner_b = runner(store_b, tmp_path, b)
        await runner_b.start()
        try:
            await asyncio.sleep(3 * LEASE_S)  # b looks for abandoned jobs twice a lease
            job = store_b.get(first)
            assert (job.status, job.attempts) == ("running", 1)  # a reports: not abandoned
            a.release.set()
            await until(lambda: store_b.get(first).is_final, 10)
            job = store_b.get(first)
            assert (job.status, job.attempts) == ("successful", 1)
            assert (tmp_path / "jobs" / first / "out.tif").read_text() == "a"

            # a goes quiet while it runs the next job: b takes it over after the lease
            a.release.clear()
            a.started.clear()
            b.release.clear()
            await runner_b.stop()
            second = store_b.create("p", SPEC).job_id
            await asyncio.wait_for(a.started.wait(), 10)
            store_a.quiet = True
            runner_b = runner(store_b, tmp_path, b)
            await runner_b.start()
            await asyncio.wait_for(b.started.wait(), 4 * LEASE_S)
            job = store_b.get(second)
            assert (job.status, job.attempts) == ("running", 2)
            store_a.quiet = False  # a reaches the store again: its reports name attempt 1
            a.release.set()
            await until(lambda: not (tmp_path / "jobs" / f".{second}.1").exists(), 5)
            job = store_b.get(second)  # a let go of it: nothing of a's run landed
            assert (job.status, job.attempts, job.progress) == ("running", 2, 0)
            assert (tmp_path / "jobs" / f".{second}.2").is_dir()  # b's run, untouched
            b.release.set()
            await until(lambda: store_b.get(second).is_final, 10)
            job = store_b.get(second)
            assert (job.status, job.attempts) == ("successful", 2)
            assert job.results is not None
            assert job.results["outputs"]["raw"]["file"] == "out.tif"
            assert (tmp_path / "jobs" / second / "out.tif").read_text() == "b"
        finally:
            await runner_a.stop()
            await runner_b.stop()

    asyncio.run(scenario())


def test_a_lease_shorter_than_four_reports_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lease"):
        JobRunner(None, tmp_path, None, None, None, lease_s=1.0)  # type: ignore[arg-type]
