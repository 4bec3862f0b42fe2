"""``JobRunner``: the workers that run a :class:`~geoserve.jobs.store.JobStore`'s jobs.

The runner requeues the jobs a stopped process left running (``store.recover``: those whose
worker has not reported for ``lease_s`` seconds) at start and every ``lease_s / 2`` seconds
after, so several processes can share one store and take over each other's jobs when one
stops; ``workers`` asyncio tasks each claim the oldest queued job, rebuild its request
(:meth:`RequestSpec.from_json`) and run it through ``execute`` (the server's own path: the
same trust rules as an interactive request), with its outputs under
``<output_dir>/jobs/<job id>/``. While a job runs, its progress (patches done out of all, from
``progress``) is written to the store every :data:`POLL_S` seconds, as a percentage and as the
status message ``"<done>/<total> patches"`` (each write the worker's heartbeat, also while the
job's STAC Item is written); every write names the worker's claim (the job's ``attempts``), so
a worker whose lease ran out cannot end a job another worker now runs. A job the store says is
no longer the worker's is cancelled in the engine; its directory is removed when the job was
dismissed, and left to the worker that took it over otherwise. A job
ends ``successful`` with its results (each output kind's file name, media type and size) or
``failed`` with an OGC exception body (a class map's ``.aux.xml`` sidecar, its class names,
named beside its file). Every :data:`EXPIRE_EVERY_S` the finished jobs older
than ``ttl_s`` are removed with their directories.

When the store fails (a :class:`~geoserve.errors.JobStoreError`: its file gone, its server
down), the workers log it once, look again less and less often (up to every
:data:`STORE_RETRY_MAX_S` seconds) and carry on when it answers again; a job already running
keeps running, and one whose end could not be recorded stays ``running`` in the store, so it
is queued again once its lease runs out.

A job's stored spec holds what the client gave: paths and URLs as named (the server vets them
again when the job runs), and for inputs sent inline, the names of the files written into the
job's directory when it was submitted (``job_files``; for uploads, ``job_names``: each file's
part file name, client text that names it in messages and gives its date stamp, never a path);
the runner reads those files of the job's own directory only; ``job_inline`` lists the
outputs the client asked to receive inline in the job's results (the server's business, not
the run's). This module imports nothing from the web layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import GeoServeError, InputError, JobStoreError, NotFoundError
from geoserve.jobs.store import Job, JobStore, is_job_id
from geoserve.raster.input_values import NamedBytes
from geoserve.schemas import ImageRequestOutput

logger = logging.getLogger(__name__)

#: How often a running job's progress is written to the store (and its dismissal noticed).
POLL_S = 0.5
#: How long a running job may go unreported before it is taken to be abandoned (the default).
LEASE_S = 30.0
#: How often finished jobs past their time to live are removed.
EXPIRE_EVERY_S = 60.0
#: How often an idle worker looks for a queued job.
IDLE_S = 0.2
#: A job started this many times (each start interrupted by a stop) is failed, not requeued.
MAX_ATTEMPTS = 3
#: How much lower than interactive requests a job runs (the scheduler runs lower first).
JOB_PRIORITY = 100
#: The longest wait between two looks at a store that failed.
STORE_RETRY_MAX_S = 5.0

#: The keys of a stored spec that are the job's, not its request's (see the module docstring).
JOB_KEYS = ("job_files", "job_names", "job_inline")

_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: ``execute(spec, job_dir)``: run a job's request, outputs in ``job_dir``, as the server does.
Execute = Callable[[RequestSpec, Path], Coroutine[Any, Any, ImageRequestOutput]]
#: ``item(job, result, directory)``: write the job's STAC Item into ``directory``; its name.
WriteItem = Callable[[Job, ImageRequestOutput, Path], str]
#: ``error_json(exc)``: the OGC exception body of a failed job.
ErrorJson = Callable[[BaseException], dict[str, Any]]

_MEDIA = {
    ".tif": "image/tiff; application=geotiff",
    ".gpkg": "application/geopackage+sqlite3",
    ".geojson": "application/geo+json",
    ".parquet": "application/vnd.apache.parquet",
}


def media_type(name: str) -> str:
    """The media type of an output file, by its suffix."""
    return _MEDIA.get(Path(name).suffix.lower(), "application/octet-stream")


def job_dir(output_dir: Path, job_id: str) -> Path:
    """A job's own directory, ``<output_dir>/jobs/<job id>`` (the id checked first)."""
    if not is_job_id(job_id):
        raise InputError("not a job id")
    return output_dir / "jobs" / job_id


def attempt_dir(output_dir: Path, job: Job) -> Path:
    """Where one run of a job writes, ``<output_dir>/jobs/.<job id>.<attempt>``.

    Moved to :func:`job_dir` once the run's claim is checked, just before it is recorded as
    finished, so a run that lost its claim (its lease ran out) never writes into the outputs
    of the run that took over.
    """
    return job_dir(output_dir, job.job_id).with_name(f".{job.job_id}.{job.attempts}")


def remove_job_dir(output_dir: Path, job_id: str) -> None:
    """Remove a job's directory, its runs' directories and everything in them (missing: fine)."""
    final = job_dir(output_dir, job_id)
    shutil.rmtree(final, ignore_errors=True)
    for run in final.parent.glob(f".{job_id}.*"):
        shutil.rmtree(run, ignore_errors=True)


_INPUTS_DIR = re.compile(r"in-[0-9a-f]{32}")


def inputs_dir(output_dir: Path, job: Job) -> Path | None:
    """The directory of the inputs a job was sent inline (``job_files``), if it has one."""
    name = job.spec.get("job_files")
    if name is None:
        return None
    if not isinstance(name, str) or not _INPUTS_DIR.fullmatch(name):
        raise InputError("a job's input directory is not one this server makes")
    return output_dir / "jobs" / name


def remove_inputs(output_dir: Path, job: Job) -> None:
    """Remove the files a job's inputs were sent as (no longer needed once it ended)."""
    with contextlib.suppress(InputError):
        directory = inputs_dir(output_dir, job)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def job_inputs(spec: RequestSpec, directory: Path, names: Any = None) -> RequestSpec:
    """A spec whose inputs name files of the job's ``directory``, with those files' bytes.

    ``names``: file -> the name to report it by (an upload's part file name); else its own.
    """
    shown = names if isinstance(names, dict) else {}

    def read(name: Any) -> NamedBytes:
        if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
            raise InputError(f"job input {str(name)[:60]!r} is not a file of the job")
        given = shown.get(name)
        label = given if isinstance(given, str) else name
        return NamedBytes((directory / name).read_bytes(), label)

    given: Any = spec.inputs
    if isinstance(given, dict):
        inputs: Any = {k: [read(x) for x in v] for k, v in given.items()}
    else:
        inputs = [read(x) for x in given]
    return RequestSpec.of(spec, inputs=inputs, data_format="bytes")


class JobRunner:
    """Runs the store's queued jobs in ``workers`` asyncio tasks (see the module docstring)."""

    def __init__(
        self,
        store: JobStore,
        output_dir: Path,
        execute: Execute,
        progress: Callable[[str], tuple[int, int] | None],
        error_json: ErrorJson,
        *,
        workers: int = 1,
        ttl_s: float = 86400.0,
        lease_s: float = LEASE_S,
        item: WriteItem | None = None,
    ) -> None:
        if not lease_s > 4 * POLL_S:
            raise ValueError(f"a job lease must be over {4 * POLL_S:g} s, not {lease_s!r}")
        self.store = store
        self.output_dir = output_dir
        self._execute = execute
        self._progress = progress
        self._error_json = error_json
        self.workers = workers
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self._item = item
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Requeue what a stopped process left running, then start the workers."""
        await self._recover()
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"geoserve-job-{i}")
            for i in range(self.workers)
        ]
        self._tasks.append(asyncio.create_task(self._expirer(), name="geoserve-job-expiry"))
        self._tasks.append(asyncio.create_task(self._recoverer(), name="geoserve-job-recovery"))

    async def _recover(self) -> None:
        recovered = await asyncio.to_thread(self.store.recover, MAX_ATTEMPTS, self.lease_s)
        for job in recovered:
            logger.info("job %s recovered as %s (its worker stopped)", job.job_id, job.status)

    async def stop(self) -> None:
        """Stop the workers; a job they were running stays ``running`` until the next start."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _worker(self) -> None:
        failures = 0
        while True:
            try:
                job = await asyncio.to_thread(self.store.claim_next)
            except Exception as exc:
                failures += 1
                if failures == 1:  # once per outage: it is tried again every few seconds
                    if isinstance(exc, JobStoreError):
                        logger.error("claiming a job failed: %s", exc)
                    else:
                        logger.exception("claiming a job failed")
                await asyncio.sleep(min(STORE_RETRY_MAX_S, IDLE_S * 2 ** min(failures, 6)))
                continue
            if failures:
                logger.info("the job store answers again")
                failures = 0
            if job is None:
                await asyncio.sleep(IDLE_S)
                continue
            try:
                await self.run_job(job)
            except asyncio.CancelledError:
                raise
            except JobStoreError as exc:  # (it stays running in the store: re-run after its lease)
                logger.error("job %s: its end was not recorded: %s", job.job_id, exc)
            except Exception:  # (run_job records failures; this guards its own bugs)
                logger.exception("job %s: the runner failed", job.job_id)

    async def _recoverer(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 2)
            try:
                await self._recover()
            except JobStoreError as exc:
                logger.error("recovering jobs failed: %s", exc)
            except Exception:
                logger.exception("recovering jobs failed")

    async def _expirer(self) -> None:
        while True:
            try:
                for job in await asyncio.to_thread(self.store.expire, self.ttl_s):
                    remove_job_dir(self.output_dir, job.job_id)
                    remove_inputs(self.output_dir, job)
            except JobStoreError as exc:
                logger.error("expiring jobs failed: %s", exc)
            except Exception:
                logger.exception("expiring jobs failed")
            await asyncio.sleep(EXPIRE_EVERY_S)

    async def run_job(self, job: Job) -> None:
        """Run one claimed job to its end (successful, failed, or dismissed meanwhile)."""
        try:
            await self._run_job(job)
        finally:
            try:
                current = await asyncio.to_thread(self.store.get, job.job_id)
            except JobStoreError as exc:  # (its inputs stay until it is known to have ended)
                logger.error("job %s: %s", job.job_id, exc)
            else:
                if current.is_final:
                    remove_inputs(self.output_dir, job)

    async def _run_job(self, job: Job) -> None:
        directory = attempt_dir(self.output_dir, job)
        try:
            stored = {k: v for k, v in job.spec.items() if k not in JOB_KEYS}
            names = job.spec.get("job_names")
            spec = RequestSpec.from_json(stored)
            files = inputs_dir(self.output_dir, job)
            if files is not None:
                spec = job_inputs(spec, files, names)
            spec = RequestSpec.of(
                spec, request_id=job.job_id, priority=JOB_PRIORITY + max(0, spec.priority)
            )
        except (GeoServeError, OSError) as exc:
            await self._fail(job, exc)
            return
        # a run starts from an empty directory of its own: nothing half-written, nobody else's
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)
        task = asyncio.create_task(self._execute(spec, directory))
        mine, total = await self._watch(job, task)
        if not mine:  # dismissed or taken over: drop its work in the engine
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await self._let_go(job, directory)
            return
        try:
            result = task.result()
            if result.error is not None:
                raise result.error
        except Exception as exc:  # (a failed job keeps no partial outputs)
            if not await self._fail(job, exc):
                await self._let_go(job, directory)
            shutil.rmtree(directory, ignore_errors=True)
            return
        results: dict[str, Any] = {"outputs": self.describe(result, directory)}
        if self._item is not None:
            write = asyncio.create_task(
                asyncio.to_thread(self._item, job, result, directory)
            )  # (hashing large outputs may take longer than a lease: reported meanwhile)
            mine, _ = await self._watch(job, write)
            if not mine:
                await self._let_go(job, directory)
                return
            try:
                results["item"] = write.result()
            except Exception:  # (the outputs stand without their description)
                logger.exception("job %s: writing its STAC Item failed", job.job_id)
        total = total or result.num_patches
        done = f"{total}/{total} patches"
        if not await asyncio.to_thread(self._publish, job, directory):
            await self._let_go(job, directory)
            return
        finish = self.store.finish
        if not await asyncio.to_thread(finish, job.job_id, results, done, attempt=job.attempts):
            await self._let_go(job, directory)

    def _publish(self, job: Job, directory: Path) -> bool:
        """Move a run's directory to the job's, if the run still holds its claim (whether so)."""
        if not self.store.progress(job.job_id, 99, None, attempt=job.attempts):
            return False
        final = job_dir(self.output_dir, job.job_id)
        shutil.rmtree(final, ignore_errors=True)
        directory.rename(final)
        return True

    async def _fail(self, job: Job, exc: BaseException) -> bool:
        """Record ``job`` (this worker's claim of it) as failed with ``exc``; whether it was."""
        error = self._error_json(exc)
        return await asyncio.to_thread(self.store.fail, job.job_id, error, attempt=job.attempts)

    async def _let_go(self, job: Job, directory: Path) -> None:
        """The job is no longer this run's: remove what the run wrote (``directory``).

        The job's own files go too when it was dismissed or removed; a job queued or claimed
        again (this worker's lease ran out) keeps them for the worker that runs it now.
        """
        shutil.rmtree(directory, ignore_errors=True)
        try:
            current = await asyncio.to_thread(self.store.get, job.job_id)
        except NotFoundError:
            current = None
        if current is not None and not current.is_final:
            logger.warning(
                "job %s: taken over by another worker (attempt %d); this one stops",
                job.job_id,
                current.attempts,
            )
            return
        remove_job_dir(self.output_dir, job.job_id)

    async def _watch(self, job: Job, task: asyncio.Task[Any]) -> tuple[bool, int]:
        """Record ``task``'s progress until it ends or the job is no longer the worker's.

        Whether it still is, and the patches counted in all (0: none counted yet).
        """
        mine, total, warned = True, 0, False
        while mine and not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            if task.done():
                break
            counted = self._progress(job.job_id)
            percent = 0 if not counted or not counted[1] else 100 * counted[0] // counted[1]
            message = None if not counted else f"{counted[0]}/{counted[1]} patches"
            total = counted[1] if counted else total
            try:
                mine = await asyncio.to_thread(
                    self.store.progress,
                    job.job_id,
                    min(percent, 99),
                    message,
                    attempt=job.attempts,
                )
            except JobStoreError as exc:  # the job runs on; its end is recorded if it can be
                if not warned:
                    logger.warning("job %s: progress not recorded: %s", job.job_id, exc)
                warned = True
        return mine, total

    @staticmethod
    def describe(result: ImageRequestOutput, directory: Path) -> dict[str, Any]:
        """Each output kind's file (a name in ``directory``), media type, size and sidecar."""
        outputs: dict[str, Any] = {}
        for kind, out in result.outputs_by_kind.items():
            if out.path is None:
                continue
            path = Path(out.path)
            outputs[kind] = {
                "file": path.name,
                "media_type": media_type(path.name),
                "size": path.stat().st_size,
            }
            sidecar = path.with_name(path.name + ".aux.xml")
            if sidecar.is_file():  # a class map's class names (GIS tools read them there)
                outputs[kind]["sidecar"] = sidecar.name
        return outputs
