"""A request's ``seed`` on every front: the CLI, ``POST /v1/images``, jobs, OGC and the client.

``test-steps`` (tests/stub_models.py) is a generative stub: its output's last band is a noise
field drawn from the request's seed, so equal seeds give equal bytes and different seeds
different ones. Each front is compared with the engine run here with the same seed, so a seed
that did not reach the engine (every request at the default 0) fails. One server per module
(real uvicorn on 127.0.0.1), on a 20 x 20 scene (four patches).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from rasterio.io import MemoryFile

import geoserve
from geoserve.cli import build_parser, main
from geoserve.errors import ConfigError
from geoserve.seeds import MAX_SEED
from tests.conftest import write_geotiff
from tests.server.conftest import running_server

MODEL = "test-steps"
#: Seeds that are not one, each as JSON sends it (text, a float, a boolean, out of range).
BAD_SEEDS: list[Any] = [-1, MAX_SEED + 1, "5", 5.0, True]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("seed_inputs")
    data = np.random.default_rng(5).integers(0, 400, (2, 20, 20)).astype(np.uint16)
    write_geotiff(root / "scene.tif", data)
    return root


@pytest.fixture(scope="module")
def local() -> Iterator[geoserve.Engine]:
    with geoserve.Engine(MODEL) as engine:
        yield engine


@pytest.fixture(scope="module")
def url(scenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("seed_outputs")
    with running_server(model=MODEL, allowed_input_dirs=[scenes], output_dir=out) as base:
        yield base


@pytest.fixture(scope="module")
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def expected(engine: geoserve.Engine, path: Path, seed: int) -> np.ndarray:
    """The engine's output of ``path`` with ``seed``, run in this process."""
    return engine.generate_image(path, out_format="tensor", seed=seed).outputs.tensor.numpy()


def pixels(geotiff: bytes) -> np.ndarray:
    with MemoryFile(geotiff) as mem, mem.open() as ds:
        return ds.read()


# -- the command line ---------------------------------------------------------------------------


def test_cli_seed_decides_the_output(scenes: Path, local: geoserve.Engine, tmp_path: Path) -> None:
    scene = scenes / "scene.tif"
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        argv = ["predict", str(scene), "-o", str(tmp_path / f"{name}.tif"), "-m", MODEL, "-q"]
        assert main([*argv, "--seed", seed]) == 0
    a, b, c = ((tmp_path / f"{n}.tif").read_bytes() for n in "abc")
    assert a == b
    assert a != c
    engine = local.generate_image(scene, output_path=tmp_path / "engine.tif", seed=5)
    assert Path(engine.outputs.path).read_bytes() == a  # the seed reached the engine


@pytest.mark.parametrize("seed", ["-1", str(MAX_SEED + 1), "x", "1.5", ""])
def test_cli_bad_seed_is_a_usage_error_naming_the_flag(
    seed: str, scenes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["predict", str(scenes / "scene.tif"), "-o", str(tmp_path / "o.tif"), "-m", MODEL]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--seed", seed])
    assert exited.value.code == 2  # as every usage error
    err = capsys.readouterr().err
    assert "argument --seed:" in err
    assert "0 to 2**63 - 1" in err
    assert "Traceback" not in err
    assert not (tmp_path / "o.tif").exists()


def test_cli_takes_the_largest_seed() -> None:
    args = build_parser().parse_args(["predict", "x.tif", "--seed", str(MAX_SEED)])
    assert args.seed == MAX_SEED
    assert build_parser().parse_args(["predict", "x.tif"]).seed == 0


# -- POST /v1/images ----------------------------------------------------------------------------


def image(http: httpx.Client, scenes: Path, options: dict[str, Any]) -> httpx.Response:
    body = {
        "data": str(scenes / "scene.tif"),
        "data_format": "path",
        "out_data_format": "geotiff",
        "options": options,
    }
    return http.post("/v1/images", json=body)


def test_images_json_and_upload_take_the_seed(
    http: httpx.Client, scenes: Path, local: geoserve.Engine
) -> None:
    scene = scenes / "scene.tif"
    one, again, other = (image(http, scenes, {"seed": s}) for s in (5, 5, 6))
    assert [r.status_code for r in (one, again, other)] == [200, 200, 200], one.text
    assert one.content == again.content
    assert one.content != other.content
    np.testing.assert_array_equal(pixels(one.content), expected(local, scene, 5))
    np.testing.assert_array_equal(pixels(other.content), expected(local, scene, 6))
    unset = image(http, scenes, {})
    np.testing.assert_array_equal(pixels(unset.content), expected(local, scene, 0))
    upload = http.post(
        "/v1/images",
        files={"file": ("scene.tif", scene.read_bytes())},
        data={"options": json.dumps({"seed": 5})},
    )
    assert upload.status_code == 200, upload.text
    np.testing.assert_array_equal(pixels(upload.content), pixels(one.content))
    inline = http.post(
        "/v1/images",
        json={
            "data": base64.b64encode(scene.read_bytes()).decode(),
            "out_data_format": "b64_json",
            "options": {"seed": 6},
        },
    )
    assert inline.status_code == 200, inline.text
    geotiff = base64.b64decode(inline.json()["data"])
    np.testing.assert_array_equal(pixels(geotiff), pixels(other.content))


@pytest.mark.parametrize("seed", BAD_SEEDS)
def test_images_bad_seed_is_a_422_naming_the_field(
    http: httpx.Client, scenes: Path, seed: Any
) -> None:
    answer = image(http, scenes, {"seed": seed})
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["message"].startswith("invalid request: options.seed: ")
    assert "Traceback" not in answer.text
    upload = http.post(
        "/v1/images",
        files={"file": ("scene.tif", (scenes / "scene.tif").read_bytes())},
        data={"options": json.dumps({"seed": seed})},
    )
    assert upload.status_code == 422, upload.text
    assert upload.json()["message"].startswith("invalid request: options.seed: ")


# -- jobs: /v1/jobs and OGC API - Processes -----------------------------------------------------


def job_output(http: httpx.Client, location: str) -> bytes:
    """Wait for the job at ``location``; its one output's bytes."""
    deadline = time.monotonic() + 60
    while (info := http.get(location).json())["status"] in ("accepted", "running"):
        assert time.monotonic() < deadline, info
        time.sleep(0.05)
    assert info["status"] == "successful", info
    results = http.get(f"{location}/results").json()
    return http.get(results["raw"]["href"]).content


def test_jobs_take_the_seed(http: httpx.Client, scenes: Path, local: geoserve.Engine) -> None:
    scene = scenes / "scene.tif"
    body = {"data": str(scene), "data_format": "path"}
    locations = []
    for seed in (5, 5, 6):
        answer = http.post("/v1/jobs", json={**body, "options": {"seed": seed}})
        assert answer.status_code == 201, answer.text
        locations.append(answer.headers["location"])
    upload = http.post(
        "/v1/jobs",
        files={"file": ("scene.tif", scene.read_bytes())},
        data={"options": json.dumps({"seed": 6})},
    )
    assert upload.status_code == 201, upload.text
    locations.append(upload.headers["location"])
    one, again, other, uploaded = (job_output(http, loc) for loc in locations)
    assert one == again
    assert one != other
    assert uploaded == other  # stored with the job, restored when it runs
    np.testing.assert_array_equal(pixels(one), expected(local, scene, 5))


@pytest.mark.parametrize("seed", BAD_SEEDS)
def test_jobs_bad_seed_is_refused_naming_the_field(
    http: httpx.Client, scenes: Path, seed: Any
) -> None:
    body = {"data": str(scenes / "scene.tif"), "data_format": "path", "options": {"seed": seed}}
    answer = http.post("/v1/jobs", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["detail"].startswith("invalid request: options.seed: ")
    ogc = http.post(
        f"/ogcapi/processes/{MODEL}/execution",
        json={"inputs": {"image": {"href": str(scenes / "scene.tif")}, "seed": seed}},
    )
    assert ogc.status_code == 400, ogc.text
    assert ogc.json()["detail"].startswith("inputs.seed: an integer from 0 to 2**63 - 1, got ")


def test_ogc_process_lists_the_seed_and_an_execution_takes_it(
    http: httpx.Client, scenes: Path, local: geoserve.Engine
) -> None:
    described = http.get(f"/ogcapi/processes/{MODEL}").json()["inputs"]["seed"]
    assert described["minOccurs"] == 0
    assert described["schema"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": MAX_SEED,
        "default": 0,
    }
    scene = scenes / "scene.tif"
    outputs = []
    for seed in (5, 6):
        answer = http.post(
            f"/ogcapi/processes/{MODEL}/execution",
            json={"inputs": {"image": {"href": str(scene)}, "seed": seed}},
            headers={"Prefer": "respond-async"},
        )
        assert answer.status_code == 201, answer.text
        outputs.append(job_output(http, answer.headers["location"]))
    np.testing.assert_array_equal(pixels(outputs[0]), expected(local, scene, 5))
    np.testing.assert_array_equal(pixels(outputs[1]), expected(local, scene, 6))


# -- geoserve.Client and predict --server -------------------------------------------------------


def test_client_takes_the_seed(
    url: str, scenes: Path, local: geoserve.Engine, tmp_path: Path
) -> None:
    scene = scenes / "scene.tif"
    with geoserve.Client(url) as client:
        one, again, other = (
            client.run(scene, tmp_path / name, seed=seed)["raw"].read_bytes()
            for name, seed in (("a", 5), ("b", 5), ("c", 6))
        )
        for seed in [*BAD_SEEDS, 1.5]:
            with pytest.raises(ConfigError, match=r"^seed: an integer from 0 to 2\*\*63 - 1"):
                client.submit(scene, seed=seed)
    assert one == again
    assert one != other
    np.testing.assert_array_equal(pixels(other), expected(local, scene, 6))


def test_predict_on_the_server_takes_the_seed(url: str, scenes: Path, tmp_path: Path) -> None:
    scene = str(scenes / "scene.tif")
    remote, here = tmp_path / "remote.tif", tmp_path / "here.tif"
    assert main(["predict", scene, "-o", str(remote), "--server", url, "--seed", "7", "-q"]) == 0
    assert main(["predict", scene, "-o", str(here), "-m", MODEL, "--seed", "7", "-q"]) == 0
    assert remote.read_bytes() == here.read_bytes()
    with pytest.raises(SystemExit) as exited:
        main(["predict", scene, "-o", str(remote), "--server", url, "--seed", "-3"])
    assert exited.value.code == 2
