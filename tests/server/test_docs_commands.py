"""The curl commands of docs/serving.md and the README, run as written against a real server.

The server is started as the docs start it (the CLI's default model); only the port, the
example URL and the size of the bundled scene (a corner of it, to keep the test quick) differ.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio

from geoserve.cli import DEFAULT_MODEL
from tests.conftest import BUNDLED_SCENE as SCENE
from tests.conftest import serve_ranges, write_bundled_corner
from tests.multimodal_scenes import write_s1, write_s2
from tests.server.conftest import running_server

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("jq")), reason="the docs' commands need curl and jq"
)


def bash_blocks(doc: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A stand-in repository root whose bundled scene is a 256 x 256 corner of the real one."""
    root = tmp_path_factory.mktemp("repo")
    write_bundled_corner(root)
    return root


@pytest.fixture(scope="module")
def default_server(workdir, tmp_path_factory) -> Iterator[tuple[str, str]]:
    with (
        serve_ranges(workdir) as (files, _),
        running_server(
            model=DEFAULT_MODEL,
            allowed_url_domains=["127.0.0.1"],
            output_dir=tmp_path_factory.mktemp("outputs"),  # for the map scenes' examples
        ) as url,
    ):
        yield url, files


def run(
    script: str, cwd: Path, url: str, files: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = script.replace("localhost:8000", url.removeprefix("http://"))
    script = script.replace("https://example.org/scene.tif", f"{files}/{SCENE}")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_serving_md_serves_the_default_model():
    first = bash_blocks("docs/serving.md")[0]
    (serve,) = [line for line in first.splitlines() if " serve " in line]
    assert "geoserve serve --port 8000" in serve
    assert "--model" not in serve.split("#")[0]  # so the server runs the default model
    assert f"| `--model NAME` | `{DEFAULT_MODEL}` |" in (ROOT / "docs/serving.md").read_text()


def test_serving_md_commands_work_on_the_bundled_scene(workdir, default_server, tmp_path):
    """The blocks in order, as one shell session started at the repository root: they write
    to a scratch folder, leave the repository as it was and print no base64 to the terminal."""
    url, files = default_server
    blocks = [b for b in bash_blocks("docs/serving.md") if "curl" in b or "cp " in b]
    # (the multi-date example needs a multi-date model and dated files: tests/server/test_dates.py;
    # the multimodal one its own server: below; the jobs' tests/server/test_jobs_docs.py)
    blocks = [b for b in blocks if "-F dates=" not in b and "-F s2=" not in b]
    blocks = [b for b in blocks if "/v1/jobs" not in b]
    assert len(blocks) >= 4, "docs/serving.md lost its examples"
    assert "mktemp -d" in blocks[0], "the examples' first block makes their scratch folder"
    before = sorted(p.name for p in workdir.iterdir())
    script = "\n".join(blocks) + '\necho "scratch: $PWD"\n'
    res = run(script, workdir, url, files, env={"TMPDIR": str(tmp_path)})
    assert res.returncode == 0, f"{script}\n{res.stderr}"
    assert sorted(p.name for p in workdir.iterdir()) == before  # nothing left in the repository
    lines = res.stdout.splitlines()
    scratch = Path(lines[-1].removeprefix("scratch: "))
    assert scratch.parent == tmp_path
    assert max(map(len, lines)) < 10_000, "an answer's base64 went to the terminal"
    assert any('"data_format":"b64_json"' in line for line in lines)  # the /pooling answer
    with rasterio.open(scratch / "water.tif") as dst:
        assert dst.tags()["CLASS_NAMES"] == "not water,water"
        assert dst.colormap(1)[1][:3] == (31, 120, 220)
    assert (scratch / "tile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the map tile
    with rasterio.open(scratch / "probabilities.tif") as dst:
        assert dst.descriptions == ("not water", "water")
        assert (dst.width, dst.height, dst.dtypes[0]) == (256, 256, "float32")
    answer = json.loads((scratch / "probabilities.json").read_text())  # the multipart b64 one
    with rasterio.MemoryFile(base64.b64decode(answer["data"])) as mem, mem.open() as dst:
        assert dst.count == 2


def test_readme_upload_fails_loudly(workdir, default_server, tmp_path):
    url, files = default_server
    (curl,) = [line for b in bash_blocks("README.md") for line in b.splitlines() if "curl" in line]
    shutil.copy(workdir / SCENE, tmp_path / "scene.tif")
    assert run(curl, tmp_path, url, files).returncode == 0
    with rasterio.open(tmp_path / "water.tif") as dst:
        assert dst.count == 1
    (tmp_path / "scene.tif").write_text("not a GeoTIFF")
    res = run(curl, tmp_path, url, files)
    assert res.returncode == 22, res.stderr  # not 0 with the error body in water.tif
    assert '"object":"error"' in (tmp_path / "water.tif").read_text()


def test_serving_md_modalities_example(tmp_path):
    """The multimodal example, against the server its comment describes, on toy S2/S1 scenes."""
    (block,) = [b for b in bash_blocks("docs/serving.md") if "-F s2=" in b]
    assert "--model s1s2-water --allowed-input-dir ." in block
    (tmp_path / "scenes").mkdir()
    for where in (tmp_path, tmp_path / "scenes"):
        write_s2(where / "S2.tif", 96)
        write_s1(where / "S1.tif", 96)
    with running_server(model="s1s2-water", allowed_input_dirs=[tmp_path]) as url:
        res = run(block, tmp_path, url, "")
    assert res.returncode == 0, f"{block}\n{res.stderr}"
    with rasterio.open(tmp_path / "fused.tif") as dst, rasterio.open(tmp_path / "S2.tif") as s2:
        assert (dst.crs, dst.transform) == (s2.crs, s2.transform)
        assert dst.tags()["CLASS_NAMES"] == "not water,water"
        fused = dst.read(1)
    answer = json.loads((tmp_path / "fused.json").read_text())
    with rasterio.MemoryFile(base64.b64decode(answer["data"])) as mem, mem.open() as dst:
        np.testing.assert_array_equal(dst.read(1), fused)


def test_scaling_md_model_header_command(workdir, tmp_path):
    """scaling.md's request naming its model in Ray Serve's header, to a server of two."""
    from geoserve import Engine

    lines = [ln for b in bash_blocks("docs/scaling.md") for ln in b.splitlines()]
    (curl,) = [ln for ln in lines if "serve_multiplexed_model_id" in ln]
    shutil.copy(workdir / SCENE, tmp_path / "scene.tif")
    with running_server(model="demo-water", models=["demo-water", "ndwi-water"]) as url:
        res = run(curl, tmp_path, url, "")
    assert res.returncode == 0, res.stderr
    want = Engine("ndwi-water").generate_image(tmp_path / "scene.tif", out_format="tensor")
    with rasterio.open(tmp_path / "water.tif") as dst:
        np.testing.assert_array_equal(dst.read(), want.outputs.tensor.numpy())
