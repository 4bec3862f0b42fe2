"""The scheduler alone, on light fake requests: which patches go into a batch, and in what order."""

from __future__ import annotations

import ast
import inspect
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest

from geoserve.engine.scheduler import Scheduler
from geoserve.errors import GeoServeError, ReadError


@dataclass
class FakePatch:
    request: FakeRequest
    index: int


@dataclass
class FakeRequest:
    """What the scheduler asks of a request, with ``n`` patches ready to pop."""

    request_id: str
    n: int = 4
    priority: int = 0
    arrival: float = 0.0
    signature: tuple[Any, ...] = ((3, 8, 8), ())
    fails_after: int | None = None  # pop_patch raises after this many patches
    error: GeoServeError | None = None
    in_flight: int = 0
    popped: int = 0
    reading: bool = False
    closed: bool = False
    started: bool = False
    ctx: Any = field(default_factory=lambda: type("Ctx", (), {"names": ("fake.tif",)})())

    def start_reading(self) -> None:
        self.started = True

    def wait_for_row(self, patience: float) -> None:
        pass

    def pending_read(self) -> Future[Any] | None:
        return None

    def pop_patch(self, wait: bool = True) -> FakePatch | None:
        if self.fails_after is not None and self.popped >= self.fails_after:
            raise IndexError("a processor bug")
        if self.popped >= self.n:
            return None
        self.popped += 1
        self.in_flight += 1
        return FakePatch(self, self.popped - 1)

    @property
    def patches_left(self) -> int:
        return self.n - self.popped + self.in_flight

    @property
    def is_complete(self) -> bool:
        return self.popped >= self.n and self.in_flight == 0

    def stop_reading(self, wait: float = 0.0) -> bool:
        return not self.reading

    def close(self) -> None:
        self.closed = True

    def result(self, output: Any = None, error: GeoServeError | None = None) -> Any:
        return (self.request_id, error)


def ids(batch: list[Any]) -> list[str]:
    return [p.request.request_id for p in batch]


def admitted(*reqs: FakeRequest) -> Scheduler:
    sched = Scheduler()
    for req in reqs:
        sched.admit(req)  # type: ignore[arg-type]
    return sched


def test_scheduler_and_failures_import_no_torch():
    import geoserve.engine.failures
    import geoserve.engine.scheduler

    for mod in (geoserve.engine.scheduler, geoserve.engine.failures):
        tree = ast.parse(inspect.getsource(mod))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in imported if m.split(".")[0] == "torch"}, mod.__name__


def test_priority_then_arrival_order():
    late_urgent = FakeRequest("urgent", n=2, priority=-1, arrival=3.0)
    first = FakeRequest("first", n=2, arrival=1.0)
    second = FakeRequest("second", n=2, arrival=2.0)
    sched = admitted(second, first, late_urgent)
    assert sched.pending_ids() == ["urgent", "first", "second"]
    assert all(r.started for r in (first, second, late_urgent))
    assert ids(sched.fill_batch(5)) == ["urgent", "urgent", "first", "first", "second"]
    assert sched.oldest_arrival == 1.0


def test_equal_keys_keep_arrival_order_of_admission():
    a, b = FakeRequest("a", n=1, arrival=1.0), FakeRequest("b", n=1, arrival=1.0)
    assert admitted(a, b).pending_ids() == ["a", "b"]


def test_batch_cap():
    sched = admitted(FakeRequest("a", n=5), FakeRequest("b", n=5, arrival=1.0))
    assert ids(sched.fill_batch(3)) == ["a"] * 3
    assert ids(sched.fill_batch(3)) == ["a", "a", "b"]
    assert ids(sched.fill_batch(100)) == ["b"] * 4
    assert sched.fill_batch(3) == []


def test_cross_request_batching_off_takes_one_request_per_batch():
    sched = admitted(FakeRequest("a", n=2), FakeRequest("b", n=2, arrival=1.0))
    assert ids(sched.fill_batch(8, cross_request=False)) == ["a", "a"]
    assert ids(sched.fill_batch(8, cross_request=False)) == ["b", "b"]


def test_signature_grouping_leaves_other_shapes_for_a_later_batch():
    other = ((6, 2, 8, 8), ("temporal_coords",))
    sched = admitted(
        FakeRequest("a", n=2),
        FakeRequest("odd", n=2, arrival=1.0, signature=other),
        FakeRequest("c", n=2, arrival=2.0),
    )
    assert ids(sched.fill_batch(8)) == ["a", "a", "c", "c"]
    assert ids(sched.fill_batch(8)) == ["odd", "odd"]


def test_a_failing_read_fails_that_request_alone():
    bad = FakeRequest("bad", n=4, fails_after=1)
    good = FakeRequest("good", n=2, arrival=1.0)
    sched = admitted(bad, good)
    batch = sched.fill_batch(8)
    assert ids(batch) == ["bad", "good", "good"]  # the patch read before it failed stays
    assert isinstance(bad.error, ReadError)
    assert "fake.tif: read failed: IndexError('a processor bug')" in str(bad.error)
    assert bad.closed
    assert sched.pending_ids() == ["good"]
    assert sched.take_failed() == [("bad", bad.error)]
    assert sched.take_failed() == []


def test_fail_is_once_and_a_busy_request_is_released_after_its_read():
    req = FakeRequest("r", n=1)
    req.reading = True
    sched = admitted(req)
    sched.fail(req, GeoServeError("first"))  # type: ignore[arg-type]
    sched.fail(req, GeoServeError("second"))  # type: ignore[arg-type]
    assert str(req.error) == "first"
    assert len(sched.failed) == 1
    assert not req.closed
    assert sched.releasing == [req]
    assert sched.has_unfinished()
    req.reading = False
    sched.release_retired()
    assert req.closed
    assert not sched.releasing


def test_abort_and_queued_patches():
    a, b = FakeRequest("a", n=3), FakeRequest("b", n=2, arrival=1.0)
    sched = admitted(a, b)
    assert sched.queued_patches == 5
    assert sched.abort("a")
    assert not sched.abort("a")
    assert a.closed
    assert sched.pending_ids() == ["b"]
    assert sched.queued_patches == 2


def test_complete_requests_are_taken_once():
    a, b = FakeRequest("a", n=1), FakeRequest("b", n=2, arrival=1.0)
    sched = admitted(a, b)
    batch = sched.fill_batch(2)
    for patch in batch:
        patch.request.in_flight -= 1
    assert [r.request_id for r in sched.take_complete()] == ["a"]
    assert sched.pending_ids() == ["b"]


@pytest.mark.parametrize("cap", [1, 2, 7])
def test_every_patch_is_scheduled_once(cap):
    reqs = [FakeRequest(f"r{i}", n=i + 1, arrival=float(i)) for i in range(4)]
    sched = admitted(*reqs)
    seen = []
    while batch := sched.fill_batch(cap):
        assert len(batch) <= cap
        seen += [(p.request.request_id, p.index) for p in batch]
    assert sorted(seen) == sorted((r.request_id, i) for r in reqs for i in range(r.n))
