"""Several output kinds over HTTP: one entry per kind, each equal to the offline engine's."""

from __future__ import annotations

import base64
import io
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pyogrio

from geoserve import Engine
from tests.conftest import write_geotiff
from tests.engine.test_embeddings import _lake_square
from tests.engine.test_output_kinds import checkerboard, checkered_tiles
from tests.server.conftest import running_server
from tests.server.test_app import b64, decode


def _offline(path, kind: str) -> np.ndarray:
    with Engine("test-seg", output_kind=kind) as engine:
        return engine.generate_image(path, out_format="tensor").outputs.tensor.numpy()


def test_output_kinds_give_one_entry_per_kind(client, data_dir):
    path = data_dir / "a.tif"
    resp = client.post(
        "/v1/images",
        json={
            "data": b64(path),
            "out_data_format": "b64_json",
            "options": {"output_kinds": ["classes", "confidence", "polygons"]},
        },
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert "data" not in body  # no kind is singled out: each has its entry
    assert list(body["outputs"]) == ["classes", "confidence", "polygons"]
    classes, _ = decode(base64.b64decode(body["outputs"]["classes"]["data"]))
    np.testing.assert_array_equal(classes, _offline(path, "classes"))
    confidence, _ = decode(base64.b64decode(body["outputs"]["confidence"]["data"]))
    np.testing.assert_allclose(confidence, _offline(path, "confidence"), rtol=1e-5)
    assert body["outputs"]["confidence"]["dtype"] == "float32"
    polygons = body["outputs"]["polygons"]
    assert polygons["dtype"] == "gpkg"  # the default polygon format
    _, _, _, (class_ids, _) = pyogrio.raw.read(io.BytesIO(base64.b64decode(polygons["data"])))
    assert len(class_ids) == polygons["count"] > 0
    assert set(class_ids.tolist()) == set(np.unique(classes).tolist())


def test_one_kind_keeps_the_single_response(client, data_dir):
    resp = client.post(
        "/v1/images",
        json={"data": b64(data_dir / "b.tif"), "options": {"output_kinds": ["confidence"]}},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert "outputs" not in body
    assert (body["count"], body["dtype"]) == (1, "float32")


def test_path_outputs_of_several_kinds_are_named_by_the_server(client, out_dir):
    resp = client.post(
        "/v1/images",
        json={
            "data": "c.tif",
            "data_format": "path",
            "out_data_format": "path",
            "options": {"output_kinds": ["probabilities", "polygons"]},
        },
        headers={"X-Request-Id": "client-chosen"},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    rid = body["request_id"]
    paths = {k: v["data"] for k, v in body["outputs"].items()}
    assert paths == {
        "probabilities": str(out_dir / f"{rid}_probabilities.tif"),
        "polygons": str(out_dir / f"{rid}_polygons.gpkg"),
    }
    assert not list(out_dir.glob("client-chosen*"))


def test_bad_kinds_are_a_4xx_naming_them(client, data_dir):
    cases = [  # (options, out_data_format, status, words of the message)
        ({"output_kinds": ["classes", "classes"]}, "b64_json", 422, "more than once"),
        ({"output_kinds": ["classes", "tokens"]}, "b64_json", 422, "output_kinds"),
        ({"output_kinds": []}, "b64_json", 422, "output_kinds"),
        ({"output_kind": "raw", "output_kinds": ["raw"]}, "b64_json", 422, "not both"),
        ({"output_kinds": ["classes", "confidence"]}, "geotiff", 400, "several output kinds"),
        ({"output_kind": "polygons"}, "geotiff", 400, "polygons"),
    ]
    for options, out_format, status, needle in cases:
        resp = client.post(
            "/v1/images",
            json={
                "data": b64(data_dir / "b.tif"),
                "out_data_format": out_format,
                "options": options,
            },
        )
        assert resp.status_code == status, (options, resp.text)
        assert needle in resp.json()["message"], (options, resp.text)
        assert "Traceback" not in resp.text


def test_models_lists_the_kinds(client):
    output = client.get("/v1/models").json()["data"][0]["output"]
    assert output["kinds"] == ["classes"]
    assert output["available_kinds"] == [
        "classes",
        "probabilities",
        "confidence",
        "raw",
        "polygons",
    ]


def test_embeddings_over_http_equal_offline(tmp_path):
    square = _lake_square(tmp_path, 224)
    body = {
        "data": base64.b64encode(Path(square).read_bytes()).decode(),
        "options": {"output_kinds": ["embeddings", "patch-embeddings", "classes"]},
    }
    with running_server(model="demo-water") as url:
        resp = httpx.post(f"{url}/v1/images", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    outputs = resp.json()["outputs"]
    assert list(outputs) == ["embeddings", "patch-embeddings", "classes"]
    tokens, profile = decode(base64.b64decode(outputs["embeddings"]["data"]))
    with Engine("demo-water", output_kind="embeddings") as engine:
        offline = engine.generate_image(square, out_format="tensor").outputs.tensor.numpy()
    assert tokens.shape == offline.shape == (128, 14, 14)
    np.testing.assert_allclose(tokens, offline, rtol=1e-5, atol=1e-6)
    table = pq.read_table(io.BytesIO(base64.b64decode(outputs["patch-embeddings"]["data"])))
    assert table.num_rows == outputs["patch-embeddings"]["count"] == 4  # 224 px in 192 px cores


def test_pooling_answers_one_geotiff_whatever_the_servers_kinds(tmp_path):
    square = _lake_square(tmp_path, 100)
    body = {"data": {"data": base64.b64encode(Path(square).read_bytes()).decode()}}
    with running_server(model="demo-water", output_kind=["polygons", "confidence"]) as url:
        resp = httpx.post(f"{url}/pooling", json=body, timeout=120)
        models = httpx.get(f"{url}/v1/models").json()["data"][0]["output"]
    assert resp.status_code == 200, resp.text
    data, profile = decode(base64.b64decode(resp.json()["data"]["data"]))
    assert (data.shape, profile["dtype"]) == ((1, 100, 100), "float32")  # the confidence
    assert models["kinds"] == ["polygons", "confidence"]
    assert "embeddings" in models["available_kinds"]


def _post_all(url: str, bodies: dict[str, dict], timeout: float = 120) -> dict[str, httpx.Response]:
    """Post every body at once (one thread each); the responses by name."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = {
            name: pool.submit(httpx.post, f"{url}/v1/images", json=body, timeout=timeout)
            for name, body in bodies.items()
        }
        return {name: fut.result() for name, fut in futures.items()}


def _scene(path: Path, data: np.ndarray, **kwargs) -> str:
    write_geotiff(path, data, descriptions=["B3", "B8"], **kwargs)
    return base64.b64encode(path.read_bytes()).decode()


def test_checkerboard_polygons_fail_alone_with_a_422_and_hold_up_nobody(tmp_path):
    """The attack: two small uploads of a checkerboard asking for polygons, and an innocent
    request beside them. The polygon requests fail at once with a 422 naming the bound; the
    innocent one is answered within its timeout."""
    board = _scene(tmp_path / "board.tif", checkerboard(256))
    small = _scene(tmp_path / "small.tif", checkerboard(16))
    polygons = {"data": board, "options": {"output_kinds": ["polygons"]}}
    bodies = {"attack1": polygons, "attack2": polygons, "innocent": {"data": small}}
    with running_server(model="ndwi-water", request_timeout_s=8) as url:
        answers = _post_all(url, bodies)
    assert answers["innocent"].status_code == 200, answers["innocent"].text
    for name in ("attack1", "attack2"):
        resp = answers[name]
        assert resp.status_code == 422, resp.text
        message = resp.json()["message"]
        assert "polygons output too complex" in message
        assert "over the bound of 65,536 for a 256x256 class map" in message
        assert "--max-polygon-vertices-per-pixel" in message


def test_a_timed_out_polygon_commit_is_cancelled_and_leaves_no_file(tmp_path):
    """Two slow polygon commits under the bound (100 checkerboards far apart: 0.8 vertices
    per pixel, tens of seconds of tracing): a plain request sent while both are committing is
    answered within its timeout; they time out with a 504 and their commits stop at the next
    polygon, so their files (temporaries included) are gone soon after, not when the tracing
    would have finished."""
    slow = _scene(tmp_path / "tiles.tif", checkered_tiles(10, 32, apart=48), nodata=0)
    small = _scene(tmp_path / "small.tif", checkerboard(16))
    polygons = {"data": slow, "out_data_format": "path", "options": {"output_kinds": ["polygons"]}}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # GeoParquet: its writer creates the vector temporary at once (GeoPackage's first batch
    # comes only after 4,096 polygons)
    server = {"request_timeout_s": 6, "output_dir": out_dir, "polygon_format": "parquet"}
    with (
        running_server(model="ndwi-water", **server) as url,
        ThreadPoolExecutor(2) as pool,
    ):
        slow_answers = [
            pool.submit(httpx.post, f"{url}/v1/images", json=polygons, timeout=120)
            for _ in range(2)
        ]
        deadline = time.monotonic() + 5
        while len(list(out_dir.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # until both commit: each its class map and its vector temporary
        assert len(list(out_dir.iterdir())) == 4
        innocent = httpx.post(f"{url}/v1/images", json={"data": small}, timeout=120)
        assert innocent.status_code == 200, innocent.text
        for answer in slow_answers:
            assert answer.result().status_code == 504, answer.result().text
        deadline = time.monotonic() + 10  # (their tracing alone takes over 20 s here)
        while list(out_dir.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(out_dir.iterdir())
