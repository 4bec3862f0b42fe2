"""One local Ray cluster for the tests of this package (starting one costs seconds).

It is stopped after the package's last test, not at the end of the session: an idle local
cluster's processes (raylet, GCS, dashboard agent, Ray Data's actors) keep using about a
tenth of a core, which every later test of a serial run would otherwise share.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[None]:
    import ray

    root = Path(__file__).resolve().parents[2]
    # workers import this checkout's geoserve (whatever copy is installed) and tests.stub_models
    path = os.pathsep.join([str(root / "src"), str(root)])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()
