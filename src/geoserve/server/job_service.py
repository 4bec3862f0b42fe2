"""The server's job store and :class:`~geoserve.jobs.runner.JobRunner`, opened with the app.

Jobs need ``--output-dir``: the store is ``job_store`` (default
``<output_dir>/jobs.sqlite3``) and each job's outputs go under ``<output_dir>/jobs/<job id>/``.
Without an output directory there is no store and the job routes say jobs are off. The runner
starts once the models have loaded, so no job runs against an engine that is not there yet; a
job runs on the engine of its process (the model it was submitted to).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geoserve.engine.async_engine import AsyncEngine
from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import ConfigError, JobStoreError
from geoserve.jobs import Job, JobStore, open_job_store
from geoserve.jobs.runner import JOB_KEYS, Execute, JobRunner
from geoserve.schemas import ImageOutput, ImageRequestOutput
from geoserve.server.errors import ogc_exception
from geoserve.server.settings import ServerSettings
from geoserve.stac_query import StacSearch

if TYPE_CHECKING:
    from geoserve.server.served import ServedEngines

logger = logging.getLogger("geoserve.server")

#: The default job store, a SQLite file in the output directory.
DEFAULT_STORE = "jobs.sqlite3"


class JobService:
    """Opens the store at start-up, runs its jobs once the engine is ready, closes both."""

    def __init__(self, settings: ServerSettings, served: ServedEngines, execute: Execute) -> None:
        self.settings = settings
        self.served = served
        self._execute = execute
        self.store: JobStore | None = None
        self.runner: JobRunner | None = None

    def current(self) -> JobStore | None:
        """The store, opened (made) on first use; ``None``: jobs are off.

        A store that cannot be made then is the server's trouble, not the request's: a
        :class:`JobStoreError` (503), tried again by the next request.
        """
        if self.store is None and self.settings.output_dir is not None:
            try:
                self.store = self._open()
            except (ConfigError, OSError) as exc:
                raise JobStoreError(f"jobs are unavailable: {exc}") from exc
        return self.store

    def _open(self) -> JobStore:
        out = self.settings.output_dir
        assert out is not None
        (out / "jobs").mkdir(parents=True, exist_ok=True)
        return open_job_store(self.settings.job_store or out / DEFAULT_STORE)

    async def open(self) -> None:
        """Open the store at start-up if there is one already or one is named.

        Else it is made when the first job comes: an output directory that never sees a job
        holds none of its files.
        """
        out = self.settings.output_dir
        if out is None:
            return
        if self.settings.job_store is not None or (out / DEFAULT_STORE).exists():
            self.store = await asyncio.to_thread(self._open)

    async def start_when_ready(self, state: dict[str, Any]) -> None:
        """Start the runner once the start-up loads are done (never if one failed)."""
        if self.settings.output_dir is None:
            return
        while not state["started"]:
            await asyncio.sleep(0.05)
        if state["load_error"] is not None:
            return
        while self.store is None:  # (made when the first job comes)
            await asyncio.sleep(0.2)
        served = self.served

        def item(job: Job, result: ImageRequestOutput, directory: Path) -> str:
            model = job.process_id if served.several else None  # (one: as it always was)
            with served.hold(model) as eng:  # (a thread of the runner's)
                return write_job_item(eng, job, result, directory)

        self.runner = JobRunner(
            self.store,
            self.settings.output_dir,
            self._execute,
            served.progress,
            ogc_exception,
            workers=self.settings.job_workers,
            ttl_s=self.settings.job_ttl_s,
            lease_s=self.settings.job_lease_s,
            item=item,
        )
        await self.runner.start()

    async def close(self) -> None:
        """Stop the runner and the store (running jobs are re-run once their lease runs out)."""
        if self.runner is not None:
            await self.runner.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)


#: The name of a finished job's STAC Item in its directory.
ITEM_NAME = "item.json"


def write_job_item(eng: AsyncEngine, job: Job, result: ImageRequestOutput, directory: Path) -> str:
    """Write a finished job's STAC Item (``item.json``) beside its outputs; its name.

    Asset hrefs are relative (``out.tif``): beside the Item's own download URL they are the
    outputs' download URLs. Inputs are named as the client gave them (a path or URL); one sent
    inline is ``inline:<n>``, never a file of the server.
    """
    from geoserve.stac_result import model_info, request_options, result_item, write_item

    stored = {k: v for k, v in job.spec.items() if k not in JOB_KEYS}
    inline = "job_files" in job.spec

    def named(value: Any, i: int) -> str:
        if isinstance(value, dict) and set(value) == {"stac_search"}:  # (its search URL)
            return str(StacSearch.from_json(value["stac_search"]))
        return f"inline:{i}" if inline else str(value)

    given = stored.get("inputs")
    inputs: Any
    if isinstance(given, dict):
        inputs = {k: [named(x, i) for i, x in enumerate(v)] for k, v in given.items()}
    else:
        inputs = [named(x, i) for i, x in enumerate(given or [])]
    options = request_options(RequestSpec.from_json({**stored, "data_format": "auto"}))

    def href(kind: str, output: ImageOutput) -> str:
        assert output.path is not None
        return Path(output.path).name

    item = result_item(
        result,
        model=model_info(eng.engine),
        inputs=inputs,
        options=options,
        item_id=job.job_id,
        hrefs=href,
    )
    write_item(item, directory / ITEM_NAME)
    return ITEM_NAME
