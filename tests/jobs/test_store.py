"""The job store's behaviour, the same on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from collections.abc import Callable
from datetime import timezone

import pytest

from geoserve.errors import InputError, NotFoundError, ShuttingDownError
from geoserve.jobs import JobStore, is_job_id
from tests.jobs import workers
from tests.jobs.conftest import FakeClock

SPEC = {"inputs": {"scene": "s3://bucket/a.tif"}, "nested": [1, 2.5, None, True], "name": "é"}
BAD_IDS = [
    "",
    "job-",
    "job-" + "0" * 31,
    "job-" + "A" * 32,
    "job-" + "0" * 33,
    "job-" + "0" * 32 + "\n",
    "x' OR '1'='1",
    "job-00000000000000000000000000000000'; DROP TABLE geoserve_jobs; --",
    "../etc/passwd",
    "job-" + "g" * 32,
    None,
    123,
    b"job-" + b"0" * 32,
]


def running(store: JobStore, process_id: str = "p") -> str:
    store.create(process_id, SPEC)
    job = store.claim_next()
    assert job is not None
    return job.job_id


def test_create_and_get(store: JobStore, clock: FakeClock) -> None:
    job = store.create("water", SPEC, owner="key-1")
    assert is_job_id(job.job_id)
    assert (job.process_id, job.status, job.spec, job.owner) == ("water", "accepted", SPEC, "key-1")
    assert job.created == job.updated == clock.now
    assert job.created.tzinfo is not None
    assert (job.started, job.finished, job.results, job.error) == (None, None, None, None)
    assert (job.progress, job.attempts, job.is_final) == (0, 0, False)
    assert store.get(job.job_id) == job
    other = store.create("water", {})
    assert other.job_id != job.job_id
    assert other.owner is None
    assert other.spec == {}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("p", ["not", "an", "object"]), "spec"),
        (("p", {"x": math.nan}), "spec"),
        (("p", {"x": object()}), "spec"),
        (("", {}), "process id"),
        (("p" * 201, {}), "process id"),
        ((None, {}), "process id"),
        (("p", {}, ""), "owner"),
        (("p", {}, 5), "owner"),
    ],
)
def test_create_refuses_bad_values(store: JobStore, args: tuple, field: str) -> None:
    with pytest.raises(InputError, match=field):
        store.create(*args)
    assert store.count() == 0


def test_unknown_and_malformed_ids(store: JobStore) -> None:
    store.create("p", SPEC)
    unknown = "job-" + "0" * 32
    with pytest.raises(NotFoundError, match="no such job"):
        store.get(unknown)
    with pytest.raises(NotFoundError):
        store.dismiss(unknown)
    # the worker's calls on a job that is gone answer False
    assert store.progress(unknown, 5) is False
    assert store.finish(unknown, {}) is False
    assert store.fail(unknown, {"type": "x"}) is False
    for bad in BAD_IDS:
        for call in (
            lambda i: store.get(i),
            lambda i: store.dismiss(i),
            lambda i: store.progress(i, 1),
            lambda i: store.finish(i, {}),
            lambda i: store.fail(i, {}),
        ):
            with pytest.raises(NotFoundError, match="not one this server makes"):
                call(bad)
    assert store.count() == 1  # the injection attempts changed nothing


def test_claim_takes_the_oldest_and_never_twice(store: JobStore, clock: FakeClock) -> None:
    assert store.claim_next() is None
    ids = []
    for i in range(3):
        ids.append(store.create("p", {"i": i}).job_id)
        clock.advance(1)
    first = store.claim_next()
    assert first is not None
    assert (first.job_id, first.status, first.attempts) == (ids[0], "running", 1)
    assert first.started == first.updated == clock.now
    assert store.get(ids[0]) == first
    second, third = store.claim_next(), store.claim_next()
    assert [j.job_id for j in (second, third) if j] == ids[1:]
    assert store.claim_next() is None
    assert store.count("running") == 3


def test_progress_never_goes_down(store: JobStore, clock: FakeClock) -> None:
    job_id = running(store)
    clock.advance(5)
    assert store.progress(job_id, 30, "reading") is True
    job = store.get(job_id)
    assert (job.progress, job.message, job.updated) == (30, "reading", clock.now)
    assert store.progress(job_id, 20, "writing") is True
    assert (store.get(job_id).progress, store.get(job_id).message) == (30, "writing")
    assert store.progress(job_id, 100) is True
    assert (store.get(job_id).progress, store.get(job_id).message) == (100, "writing")
    for bad in (-1, 101, 5.5, True, "50", None):
        with pytest.raises(InputError, match="progress"):
            store.progress(job_id, bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="message"):
        store.progress(job_id, 50, 5)  # type: ignore[arg-type]
    queued = store.create("p", SPEC).job_id
    assert store.progress(queued, 50) is False
    assert store.get(queued).progress == 0


def test_finish(store: JobStore, clock: FakeClock) -> None:
    queued = store.create("p", SPEC).job_id
    assert store.finish(queued, {"out": 1}) is False  # never claimed
    assert store.get(queued).status == "accepted"
    job_id = store.claim_next().job_id  # type: ignore[union-attr]
    store.progress(job_id, 40)
    clock.advance(7)
    assert store.finish(job_id, {"out": "a.tif"}) is True
    job = store.get(job_id)
    assert (job.status, job.results, job.progress, job.is_final) == (
        "successful",
        {"out": "a.tif"},
        100,
        True,
    )
    assert job.finished == job.updated == clock.now
    clock.advance(1)
    assert store.finish(job_id, {"out": "b.tif"}) is False
    assert store.fail(job_id, {"type": "late"}) is False
    assert store.progress(job_id, 10) is False
    assert store.claim_next() is None  # a finished job is never claimed again
    assert store.get(job_id) == job
    with pytest.raises(InputError, match="results"):
        store.finish(job_id, [1])  # type: ignore[arg-type]


def test_fail(store: JobStore) -> None:
    job_id = running(store)
    error = {"type": "InvalidParameterValue", "title": "Bad input", "detail": "band 3 is NaN"}
    assert store.fail(job_id, error) is True
    job = store.get(job_id)
    assert (job.status, job.error, job.message, job.results) == (
        "failed",
        error,
        "band 3 is NaN",
        None,
    )
    assert job.finished is not None
    assert store.fail(job_id, {"type": "again"}) is False
    assert store.finish(job_id, {}) is False
    assert store.get(job_id) == job
    # an accepted job may fail before it starts (it then never started)
    queued = store.create("p", SPEC).job_id
    assert store.fail(queued, {"type": "NoSuchProcess"}) is True
    job = store.get(queued)
    assert (job.status, job.started, job.attempts, job.message) == ("failed", None, 0, "failed")
    assert store.claim_next() is None


def test_dismiss(store: JobStore, clock: FakeClock) -> None:
    queued = store.create("p", SPEC).job_id
    dismissed = store.dismiss(queued)
    assert (dismissed.status, dismissed.finished, dismissed.is_final) == (
        "dismissed",
        clock.now,
        True,
    )
    assert store.claim_next() is None  # a dismissed job is never claimed
    # a running job: the worker, not noticing, is told its reports no longer count
    job_id = running(store)
    clock.advance(1)
    assert store.dismiss(job_id).status == "dismissed"
    assert store.progress(job_id, 90) is False
    assert store.finish(job_id, {"out": "x"}) is False
    assert store.fail(job_id, {"type": "x"}) is False
    job = store.get(job_id)
    assert (job.status, job.results, job.error, job.progress) == ("dismissed", None, None, 0)
    # a finished job keeps its results (their files are the caller's to delete) and its end
    done = running(store)
    store.finish(done, {"out": "y.tif"})
    finished_at = clock.now
    clock.advance(60)
    job = store.dismiss(done)
    assert (job.status, job.results, job.finished, job.updated) == (
        "dismissed",
        {"out": "y.tif"},
        finished_at,
        clock.now,
    )
    clock.advance(60)
    assert store.dismiss(done) == job  # twice: nothing changes


def test_list_pages_newest_first_and_filters(store: JobStore, clock: FakeClock) -> None:
    made = []
    for i in range(25):
        made.append(store.create("a" if i % 2 else "b", {"i": i}, owner=f"k{i % 3}").job_id)
        clock.advance(1)
    newest_first = made[::-1]
    for _ in range(3):
        store.claim_next()  # made[0..2] run
    store.finish(made[0], {})
    pages = [store.list(limit=10, offset=o) for o in (0, 10, 20, 30)]
    assert [total for _, total in pages] == [25] * 4
    assert [j.job_id for jobs, _ in pages for j in jobs] == newest_first
    assert [len(jobs) for jobs, _ in pages] == [10, 10, 5, 0]
    jobs, total = store.list(status="running")
    assert ([j.job_id for j in jobs], total) == ([made[2], made[1]], 2)
    jobs, total = store.list(status=["running", "successful"], process_id="b")
    assert ([j.job_id for j in jobs], total) == ([made[2], made[0]], 2)
    jobs, total = store.list(process_id=["a"], limit=3, offset=1)
    assert ([j.job_id for j in jobs], total) == ([made[21], made[19], made[17]], 12)
    jobs, total = store.list(owner="k1", status="accepted", limit=100)
    assert total == len(jobs) == len([i for i in range(3, 25) if i % 3 == 1])
    assert store.list(process_id="nothing") == ([], 0)
    assert store.list(status=[]) == ([], 0)
    assert store.list(limit=10_000)[1] == 25


@pytest.mark.parametrize(
    "kwargs",
    [
        {"status": "done"},
        {"status": ["running", "paused"]},
        {"limit": 0},
        {"limit": 10_001},
        {"limit": 2.0},
        {"offset": -1},
        {"offset": True},
        {"process_id": [3]},
    ],
)
def test_list_refuses_bad_arguments(store: JobStore, kwargs: dict) -> None:
    with pytest.raises(InputError):
        store.list(**kwargs)


def test_count(store: JobStore) -> None:
    assert store.count() == 0
    for _ in range(4):
        store.create("p", SPEC)
    store.claim_next()
    assert (store.count(), store.count("accepted"), store.count(("accepted", "running"))) == (
        4,
        3,
        4,
    )
    assert store.count([]) == 0
    with pytest.raises(InputError, match="unknown job status 'queued'"):
        store.count("queued")


def test_recover_requeues_then_gives_up(store: JobStore, clock: FakeClock) -> None:
    crashy = running(store)  # attempt 1
    store.progress(crashy, 60)
    done = running(store)
    store.finish(done, {"out": 1})
    queued = store.create("p", SPEC).job_id
    before = {j: store.get(j) for j in (done, queued)}
    clock.advance(10)
    recovered = store.recover(max_attempts=2)
    assert [(j.job_id, j.status) for j in recovered] == [(crashy, "accepted")]
    job = store.get(crashy)
    assert (job.status, job.started, job.progress, job.attempts) == ("accepted", None, 0, 1)
    assert {j: store.get(j) for j in (done, queued)} == before  # only running jobs move
    assert store.recover(max_attempts=2) == []
    claimed = store.claim_next()  # attempt 2: the oldest accepted is the recovered job
    assert claimed is not None
    assert (claimed.job_id, claimed.attempts) == (crashy, 2)
    (failed,) = store.recover(max_attempts=2)
    assert (failed.job_id, failed.status, failed.finished) == (crashy, "failed", clock.now)
    assert failed.error is not None
    assert failed.error["type"] == "JobInterrupted"
    assert "2 attempts" in failed.error["detail"]
    assert failed.message == failed.error["detail"]
    assert store.get(crashy) == failed
    assert store.claim_next().job_id == queued  # type: ignore[union-attr]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="max_attempts"):
            store.recover(bad)  # type: ignore[arg-type]


def test_expire_removes_old_finished_jobs(store: JobStore, clock: FakeClock) -> None:
    succeeded = running(store)
    store.finish(succeeded, {"out": "s.tif"})
    clock.advance(100)
    failed = running(store)
    store.fail(failed, {"type": "x"})
    dismissed_while_running = running(store)
    store.dismiss(dismissed_while_running)
    clock.advance(100)
    stuck = running(store)
    old_queued = store.create("p", SPEC).job_id
    clock.advance(1000)
    assert store.expire(10_000) == []
    gone = store.expire(1150)
    assert [(j.job_id, j.results) for j in gone] == [(succeeded, {"out": "s.tif"})]
    with pytest.raises(NotFoundError):
        store.get(succeeded)
    gone = store.expire(0)
    assert {j.job_id for j in gone} == {failed, dismissed_while_running}
    assert {j.job_id for j in store.list()[0]} == {stuck, old_queued}  # unfinished jobs stay
    # the worker of the dismissed job, still going, finds it gone
    assert store.finish(dismissed_while_running, {}) is False
    assert store.expire(math.inf) == []
    assert store.expire(1e300) == []
    for bad in (-1, math.nan, "10", None):
        with pytest.raises(InputError, match="time to live"):
            store.expire(bad)  # type: ignore[arg-type]


def test_threads_claim_each_job_exactly_once(store: JobStore) -> None:
    made = {store.create("p", {"i": i}).job_id for i in range(80)}
    claimed: list[list[str]] = [[] for _ in range(8)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []
    left_when_told_empty: list[int] = []

    def work(mine: list[str]) -> None:
        try:
            barrier.wait()
            while (job := store.claim_next()) is not None:
                mine.append(job.job_id)
                time.sleep(0.002)  # the job's work, during which the other threads claim
                assert store.progress(job.job_id, 50)
            # None means empty, but for jobs the other 7 threads were claiming at that moment
            left_when_told_empty.append(store.count("accepted"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(mine,)) for mine in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert max(left_when_told_empty) <= 7, left_when_told_empty
    every = [job_id for mine in claimed for job_id in mine]
    assert len(every) == len(set(every)) == 80
    assert set(every) == made
    assert sum(1 for mine in claimed if mine) > 1  # the claims really were concurrent
    jobs, _ = store.list(limit=100)
    assert {(j.status, j.attempts) for j in jobs} == {("running", 1)}


def test_two_processes_claim_each_job_exactly_once(
    store: JobStore, open_store: Callable[..., JobStore], store_url: str
) -> None:
    made = {store.create("p", {"i": i}).job_id for i in range(60)}
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=workers.claim_all, args=(store_url, barrier, results)) for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    claimed = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    every = [job_id for mine in claimed for job_id in mine]
    assert len(every) == len(set(every)) == 60
    assert set(every) == made
    jobs, _ = open_store().list(limit=100)
    assert {(j.status, j.attempts) for j in jobs} == {("successful", 1)}
    assert all(claimed)  # both processes claimed jobs
    assert len({j.results["pid"] for j in jobs if j.results}) == 2


def test_reopened_store_has_the_jobs(
    store: JobStore, open_store: Callable[..., JobStore], clock: FakeClock
) -> None:
    done = running(store)
    store.finish(done, {"out": "a.tif"})
    queued = store.create("q", SPEC, owner="k").job_id
    before = store.list()
    store.close()
    store.close()  # twice is fine
    with pytest.raises(ShuttingDownError, match="closed"):
        store.get(done)
    with pytest.raises(ShuttingDownError):
        store.claim_next()
    again = open_store(clock)
    assert again.list() == before
    assert again.get(done).created.tzinfo == timezone.utc
    assert again.claim_next().job_id == queued  # type: ignore[union-attr]


def test_recover_with_a_lease_requeues_only_jobs_gone_quiet(
    store: JobStore, clock: FakeClock
) -> None:
    quiet, alive = running(store), running(store)
    clock.advance(20)
    assert store.progress(alive, 10)  # a report: the worker's heartbeat (updated moves on)
    clock.advance(15)  # quiet: 35 s without a report; alive: 15 s
    recovered = store.recover(max_attempts=3, stale_after_s=30)
    assert [(j.job_id, j.status) for j in recovered] == [(quiet, "accepted")]
    assert store.get(alive).status == "running"
    assert store.progress(alive, 10)  # the same percentage again still counts as a report
    clock.advance(29)
    assert store.recover(max_attempts=3, stale_after_s=30) == []
    assert store.recover(max_attempts=3, stale_after_s=float("inf")) == []
    for bad in (-1, "30", float("nan"), True):
        with pytest.raises(InputError, match="stale_after_s"):
            store.recover(3, stale_after_s=bad)  # type: ignore[arg-type]


def test_a_worker_whose_claim_was_taken_over_changes_nothing(
    store: JobStore, clock: FakeClock
) -> None:
    job_id = running(store)
    first = store.get(job_id).attempts
    clock.advance(60)
    store.recover(max_attempts=3, stale_after_s=30)
    second = store.claim_next()
    assert second is not None
    assert (second.job_id, second.attempts) == (job_id, first + 1)
    # the first worker wakes up: none of its reports lands on the second one's run
    assert not store.progress(job_id, 90, "late", attempt=first)
    assert not store.finish(job_id, {"out": "first"}, attempt=first)
    assert not store.fail(job_id, {"type": "x", "detail": "late"}, attempt=first)
    job = store.get(job_id)
    assert (job.status, job.progress, job.attempts, job.results) == ("running", 0, 2, None)
    assert store.progress(job_id, 40, attempt=second.attempts)
    assert store.finish(job_id, {"out": "second"}, attempt=second.attempts)
    assert store.get(job_id).results == {"out": "second"}
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InputError, match="attempt"):
            store.progress(job_id, 1, attempt=bad)  # type: ignore[arg-type]
