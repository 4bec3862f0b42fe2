"""docs/serving.md's jobs commands (submit, status, results, inline results, dismiss, OGC
execution), run as written against a real server of the default model.

Only the port, the example URL and the size of the bundled scene (a corner of it) differ, as
in :mod:`tests.server.test_docs_commands`, whose scratch-folder block they run after.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio

from geoserve.cli import DEFAULT_MODEL
from tests.conftest import BUNDLED_SCENE, serve_ranges, write_bundled_corner
from tests.server.conftest import running_server
from tests.server.test_docs_commands import bash_blocks, run

pytestmark = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("jq")), reason="the docs' commands need curl and jq"
)


def jobs_block() -> str:
    (block,) = [b for b in bash_blocks("docs/serving.md") if "/v1/jobs" in b]
    return block


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_bundled_corner(root)
    return root


@pytest.fixture(scope="module")
def served(workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    outputs = tmp_path_factory.mktemp("job_outputs")
    with (
        serve_ranges(workdir) as (files, _),
        running_server(
            model=DEFAULT_MODEL, allowed_url_domains=["127.0.0.1"], output_dir=outputs
        ) as url,
    ):
        yield url, files


def test_serving_md_jobs_commands(workdir: Path, served: tuple[str, str], tmp_path: Path) -> None:
    """The jobs block in the examples' scratch folder: the job's output is the bytes
    ``/v1/images`` answers, inline as by link; dismissed at the end; the OGC execution
    answers 201 with the job's Location."""
    url, files = served
    (first,) = [b for b in bash_blocks("docs/serving.md") if "mktemp -d" in b]
    block = jobs_block()
    for command in ("-F file=@scene.tif", "return=representation", "-X DELETE", "respond-async"):
        assert command in block, command
    script = first + block + 'echo "scratch: $PWD"\n'
    res = run(script, workdir, url, files, env={"TMPDIR": str(tmp_path)})
    assert res.returncode == 0, f"{script}\n{res.stderr}"
    lines = res.stdout.splitlines()
    scratch = Path(lines[-1].removeprefix("scratch: "))
    assert scratch.parent == tmp_path
    status = json.loads(lines[0])  # the status right after submitting
    assert status["status"] in ("accepted", "running", "successful"), status
    assert "dismissed" in lines  # DELETE's answer
    assert max(map(len, lines)) < 1000, "base64 went to the terminal"
    results = json.loads((scratch / "results.json").read_text())
    assert set(results) == {"classes", "stac-item"}
    assert results["classes"]["href"].startswith(url + "/v1/jobs/job-")
    inline = json.loads((scratch / "inline.json").read_text())
    assert inline["classes"]["encoding"] == "base64"
    assert "href" not in inline["classes"]
    job_bytes = (scratch / "job_water.tif").read_bytes()
    assert (scratch / "inline_water.tif").read_bytes() == job_bytes
    direct = httpx.post(
        f"{url}/v1/images",
        files={"file": ("scene.tif", (workdir / BUNDLED_SCENE).read_bytes())},
        timeout=120,
    )
    assert direct.status_code == 200, direct.text
    assert job_bytes == direct.content  # a job's output is the interactive answer, bit for bit
    with rasterio.open(scratch / "job_water.tif") as dst:
        assert dst.tags()["CLASS_NAMES"] == "not water,water"
        assert (dst.width, dst.height) == (256, 256)
    (location,) = re.findall(r"(?im)^location: (\S+)", (scratch / "headers.txt").read_text())
    assert "/ogcapi/jobs/job-" in location
    ogc = json.loads((scratch / "status.json").read_text())
    assert location.endswith(ogc["jobID"])
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=30) as client:
        while (info := client.get(location).json())["status"] in ("accepted", "running"):
            assert time.monotonic() < deadline, info
            time.sleep(0.1)
        assert info["status"] == "successful", info
        ogc_results = client.get(f"{location}/results").json()
        ogc_bytes = client.get(ogc_results["classes"]["href"]).content
    np.testing.assert_array_equal(_pixels(ogc_bytes), _pixels(job_bytes))  # by URL: the same map


def _pixels(data: bytes) -> np.ndarray:
    with rasterio.MemoryFile(data) as mem, mem.open() as dst:
        return dst.read()
