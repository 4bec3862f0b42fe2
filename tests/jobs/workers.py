"""What each process of the two-process claim test runs (imported by name under spawn)."""

from __future__ import annotations

import os
import time
from typing import Any

from geoserve.jobs import open_job_store


def claim_all(url: str, barrier: Any, results: Any) -> None:
    """Claim and finish jobs from the store at ``url`` until none is left; put the ids claimed."""
    store = open_job_store(url)
    claimed = []
    try:
        barrier.wait(timeout=120)
        while (job := store.claim_next()) is not None:
            claimed.append(job.job_id)
            time.sleep(0.002)  # the job's work, during which the other process claims
            if not store.finish(job.job_id, {"pid": os.getpid()}):
                raise AssertionError(f"{job.job_id} was claimed but could not be finished")
    finally:
        store.close()
        results.put(claimed)
