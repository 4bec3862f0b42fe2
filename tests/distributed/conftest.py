"""One local Ray cluster for the whole session (starting one costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    root = str(Path(__file__).resolve().parents[2])  # so workers can import tests.stub_models
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": root}},
    )
    yield
    ray.shutdown()
