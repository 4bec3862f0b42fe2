"""Every endpoint against a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from rasterio.io import MemoryFile

from geoserve import Engine
from tests.conftest import read, serve_ranges, write_geotiff
from tests.server.conftest import API_KEY


def decode(raw: bytes) -> tuple[np.ndarray, dict]:
    with MemoryFile(raw) as mem, mem.open() as ds:
        return ds.read(), dict(ds.profile)


def offline(path: Path, **kwargs) -> np.ndarray:
    return (
        Engine("test-seg", **kwargs)
        .generate_image(path, out_format="tensor")
        .outputs.tensor.numpy()
    )


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_health_and_models(server, client):
    assert httpx.get(f"{server}/health/live").json() == {"status": "ok"}
    assert httpx.get(f"{server}/health/ready").json() == {"status": "ready"}
    body = client.get("/v1/models").json()
    model = body["data"][0]
    assert body["object"] == "list"
    assert model["id"] == "test-seg"
    assert model["output"]["kind"] == "classes"
    assert model["output"]["classes"] == ["a", "b", "c", "d"]
    assert model["input"]["patch_size"] == 16


def test_multipart_upload_returns_geotiff_equal_to_offline(client, data_dir):
    path = data_dir / "a.tif"
    resp = client.post("/v1/images", files={"file": ("a.tif", path.read_bytes())})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/tiff"
    assert resp.headers["x-request-id"].startswith("geo-")
    timings = json.loads(resp.headers["x-geoserve-timings"])
    assert set(timings) == {
        "read",
        "model",
        "stitch",
        "write",
        "read_busy",
        "device",
        "device_wait",
        "finalize",
    }
    assert timings["read_busy"] > 0  # the readers
    assert timings["finalize"] > 0  # and the writer
    assert timings["device"] == 0  # no CUDA device
    data, profile = decode(resp.content)
    np.testing.assert_array_equal(data, offline(path))
    _, src = read(path)
    assert (profile["crs"], profile["transform"]) == (src["crs"], src["transform"])


def test_json_b64_in_b64_out_with_options(client, data_dir):
    path = data_dir / "c.tif"
    resp = client.post(
        "/v1/images",
        json={
            "data": b64(path),
            "data_format": "b64_json",
            "out_data_format": "b64_json",
            "options": {"output_kind": "probabilities"},
        },
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == "test-seg"
    assert body["count"] == 4
    assert body["dtype"] == "float32"
    data, _ = decode(base64.b64decode(body["data"]))
    np.testing.assert_allclose(data, offline(path, output_kind="probabilities"), rtol=1e-5)


def test_path_in_path_out_only_under_output_dir(client, data_dir, out_dir):
    resp = client.post(
        "/v1/images",
        json={"data": "b.tif", "data_format": "path", "out_data_format": "path"},
        headers={"X-Request-Id": "my-req-1"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-request-id"] == "my-req-1"  # echoed, never used as a file name
    out = Path(resp.json()["data"])
    assert out.parent == out_dir
    assert out.name == f"{resp.json()['request_id']}.tif"
    np.testing.assert_array_equal(read(out)[0], offline(data_dir / "b.tif"))


def test_pooling_vllm_request_and_response_shapes(client, data_dir):
    request = {
        "model": "test-seg",
        "data": {
            "data": str(data_dir / "a.tif"),
            "data_format": "path",
            "out_data_format": "b64_json",
            "indices": [2, 1, 0],
        },
        "priority": 0,
        "softmax": False,  # extra fields of older vLLM clients are ignored
    }
    resp = client.post("/pooling", json=request)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"request_id", "created_at", "data"}
    assert set(body["data"]) == {"data_format", "data", "request_id"}
    assert body["data"]["data_format"] == "b64_json"
    assert body["data"]["request_id"] == body["request_id"]
    data, _ = decode(base64.b64decode(body["data"]["data"]))
    np.testing.assert_array_equal(data, offline(data_dir / "a.tif", bands=[2, 1, 0]))
    other = client.post("/pooling", json={**request, "model": "prithvi"})
    assert other.status_code == 404
    assert "unknown model 'prithvi'" in other.json()["message"]


@pytest.mark.parametrize(
    "bad_path",
    [
        "../outside.tif",
        "/etc/passwd",
        "file:///etc/passwd",
        "%2e%2e/outside.tif",
        "sub/../../outside.tif",
        "link.tif",
    ],
)
def test_path_traversal_refused(client, data_dir, bad_path):
    outside = data_dir.parent / "outside.tif"
    write_geotiff(outside, np.ones((3, 8, 8), dtype=np.uint16))
    link = data_dir / "link.tif"
    if not link.exists():
        link.symlink_to(outside)
    resp = client.post("/v1/images", json={"data": bad_path, "data_format": "path"})
    assert resp.status_code == 403, resp.text
    assert resp.json()["type"] == "ForbiddenInputError"


def test_url_inputs_allowed_domain_only(client, server, data_dir):
    # the server itself is on the allowed host 127.0.0.1: serve a GeoTIFF from a tiny app there
    resp = client.post(
        "/v1/images", json={"data": "http://example.com/a.tif", "data_format": "url"}
    )
    assert resp.status_code == 403
    assert "not an allowed URL domain" in resp.json()["message"]
    resp = client.post("/v1/images", json={"data": "file:///etc/passwd", "data_format": "url"})
    assert resp.status_code == 403
    resp = client.post("/v1/images", json={"data": f"{server}/health/live", "data_format": "url"})
    assert resp.status_code == 400  # fetched fine, but it is JSON, not a raster
    assert "not a readable raster" in resp.json()["message"]


def test_api_key_guards_everything_but_health(server):
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert httpx.get(f"{server}/metrics").status_code == 401
    assert httpx.post(f"{server}/pooling", json={}).status_code == 401
    wrong = httpx.get(f"{server}/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(f"{server}/v1/models", headers={"X-API-Key": API_KEY}).status_code == 200
    assert httpx.get(f"{server}/health/ready").status_code == 200


def test_body_limit_declared_and_streamed(client):
    big = b"x" * (3 * 1024 * 1024)
    resp = client.post("/v1/images", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413

    def chunks():
        for _ in range(30):
            yield b"y" * (128 * 1024)

    resp = client.post("/v1/images", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["type"] == "PayloadTooLargeError"


def test_decoded_pixel_limit(client, tmp_path):
    path = write_geotiff(
        tmp_path / "big.tif", np.zeros((3, 400, 400), dtype=np.uint8), compress="deflate"
    )
    assert len(path.read_bytes()) < 100_000  # small on the wire, large decoded
    resp = client.post("/v1/images", files={"file": ("big.tif", path.read_bytes())})
    assert resp.status_code == 413
    assert "over the limit" in resp.json()["message"]


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        (
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "not valid JSON",
        ),
        (
            {"json": {"data": "%%%not-base64%%%", "data_format": "b64_json"}},
            400,
            "not valid base64",
        ),
        (
            {"json": {"data": base64.b64encode(b"GIF89a" * 20).decode()}},
            400,
            "(format GIF); allowed input formats: GTiff",
        ),
        ({"json": {"data": "x", "data_format": "carrier-pigeon"}}, 422, "data_format"),
        ({"json": {"data": "x", "surprise": 1}}, 422, "surprise"),
        ({"files": {"file": ("x.tif", b"\x00" * 100)}}, 400, "not a readable raster"),
        ({"files": {"file": ("x.tif", b"II*\x00")}, "data": {"options": "{bad"}}, 400, "options"),
    ],
)
def test_malformed_input_is_a_4xx_with_a_message(client, kwargs, status, needle):
    resp = client.post("/v1/images", **kwargs)
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert needle in body["message"]
    assert "Traceback" not in resp.text


def test_wrong_bands_is_400_naming_file_and_band(client, tmp_path):
    path = write_geotiff(tmp_path / "two.tif", np.ones((2, 8, 8), dtype=np.uint16))
    resp = client.post("/v1/images", json={"data": b64(path)})
    assert resp.status_code == 400
    assert "has 2 bands; band index 2" in resp.json()["message"]


def test_path_output_disabled_without_output_dir(data_dir):
    from tests.server.conftest import running_server

    with running_server(allowed_input_dirs=[data_dir]) as url:
        resp = httpx.post(
            f"{url}/v1/images",
            json={"data": "a.tif", "data_format": "path", "out_data_format": "path"},
        )
        assert resp.status_code == 403
        assert "--output-dir" in resp.json()["message"]
        resp = httpx.post(
            f"{url}/v1/images", json={"data": "http://127.0.0.1/x.tif", "data_format": "url"}
        )
        assert resp.status_code == 403
        assert "--allowed-url-domain" in resp.json()["message"]


def test_twenty_concurrent_clients_match_offline(server, data_dir, tmp_path):
    rng = np.random.default_rng(11)
    paths = []
    for i in range(20):
        h, w = int(rng.integers(5, 70)), int(rng.integers(5, 70))
        paths.append(
            write_geotiff(tmp_path / f"s{i}.tif", rng.integers(0, 400, (3, h, w)).astype(np.uint16))
        )

    async def one(ac: httpx.AsyncClient, path: Path) -> bytes:
        resp = await ac.post("/v1/images", files={"file": (path.name, path.read_bytes())})
        assert resp.status_code == 200, resp.text
        return resp.content

    async def main() -> list[bytes]:
        async with httpx.AsyncClient(
            base_url=server, timeout=60, headers={"X-API-Key": API_KEY}
        ) as ac:
            return await asyncio.gather(*(one(ac, p) for p in paths))

    outputs = asyncio.run(main())
    engine = Engine("test-seg")
    for path, raw in zip(paths, outputs, strict=True):
        expected = engine.generate_image(path, out_format="tensor").outputs.tensor.numpy()
        np.testing.assert_array_equal(decode(raw)[0], expected)


def test_metrics_exposes_geoserve_series(client, data_dir):
    client.post("/v1/images", files={"file": ("a.tif", (data_dir / "a.tif").read_bytes())})
    text = client.get("/metrics").text
    for name in (
        "geoserve_requests_total",
        "geoserve_patches_total",
        "geoserve_batch_size_patches_bucket",
        "geoserve_batch_fill_ratio_bucket",
        "geoserve_queue_depth_patches",
        "geoserve_stage_seconds_bucket",
        "geoserve_errors_total",
        "geoserve_request_duration_seconds_bucket",
    ):
        assert name in text, name
    assert 'geoserve_requests_total{endpoint="/v1/images",status="200"}' in text
    assert 'stage="model"' in text
    assert 'stage="read"' in text
    assert 'stage="write"' in text
    for stage in ("read_busy", "device", "device_wait", "finalize"):
        assert f'stage="{stage}"' in text, stage


def test_url_input_from_an_allowed_host(client, data_dir):
    import http.server
    import threading

    class Redirect(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(data_dir), **kwargs)

        def do_GET(self):  # noqa: N802
            if self.path == "/moved.tif":
                self.send_response(302)
                self.send_header("Location", "/a.tif")
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        resp = client.post(
            "/v1/images",
            json={"data": f"{base}/a.tif", "data_format": "url", "out_data_format": "geotiff"},
        )
        assert resp.status_code == 200, resp.text
        np.testing.assert_array_equal(decode(resp.content)[0], offline(data_dir / "a.tif"))
        moved = client.post("/v1/images", json={"data": f"{base}/moved.tif", "data_format": "url"})
        assert moved.status_code == 403
        assert "redirects are not followed" in moved.json()["message"]
        missing = client.post("/v1/images", json={"data": f"{base}/nope.tif", "data_format": "url"})
        assert missing.status_code == 400
        assert "HTTP 404" in missing.json()["message"]
    finally:
        httpd.shutdown()


def test_several_dates_in_one_upload(tmp_path):
    from tests.server.conftest import running_server

    parts = []
    for t, date in enumerate(("2021-05-01", "2021-06-01")):
        path = write_geotiff(
            tmp_path / f"d{t}.tif",
            np.full((2, 16, 16), t + 1, np.int16),
            tags={"ACQUISITION_DATE": date},
        )
        parts.append(("file", (path.name, path.read_bytes())))
    with running_server(model="test-coords") as url:
        resp = httpx.post(f"{url}/v1/images", files=parts)
        assert resp.status_code == 200, resp.text
        data, _ = decode(resp.content)
        assert (data[0] == 1).all()
        assert (data[1] == 2).all()
        assert (data[3] == 121).all()
        assert (data[5] == 152).all()
        one = httpx.post(f"{url}/v1/images", files=parts[:1])
        assert one.status_code == 400
        assert "takes 2 date(s) per request, got 1" in one.json()["message"]


def test_url_input_read_in_place_by_range_requests(client, data_dir, tmp_path):
    """A COG behind a range-capable host is read window by window through GDAL's /vsicurl/,
    never downloaded whole, and gives the same output as the file itself."""
    cog = tmp_path / "scene.tif"
    rng = np.random.default_rng(5)
    write_geotiff(
        cog,
        rng.integers(0, 400, (3, 300, 280)).astype(np.uint16),
        tiled=True,
        blockxsize=256,
        blockysize=256,
        compress="deflate",
    )
    with serve_ranges(tmp_path) as (base, log):
        resp = client.post(
            "/v1/images",
            json={"data": f"{base}/scene.tif", "data_format": "url", "out_data_format": "geotiff"},
        )
        assert resp.status_code == 200, resp.text
        np.testing.assert_array_equal(decode(resp.content)[0], offline(cog))
        gets = [entry for entry in log if entry[0] == "GET"]
        assert gets
        assert all(r is not None for _, _, r in gets)  # only range requests, no whole download
        assert len(gets) > 1


def test_pipeline_settings_reach_the_engine(tmp_path):
    """Server-wide pipeline knobs: auto batch, no read-ahead, COG answers; same numbers."""
    from rio_cogeo.cogeo import cog_validate

    from tests.server.conftest import running_server

    rng = np.random.default_rng(11)
    path = write_geotiff(tmp_path / "s.tif", rng.integers(0, 400, (3, 90, 70)).astype(np.uint16))
    knobs = {"max_batch_patches": "auto", "read_workers": 1, "prefetch_rows": 0, "cog": True}
    with running_server(**knobs) as url:
        resp = httpx.post(f"{url}/v1/images", files={"file": path.read_bytes()}, timeout=60)
    assert resp.status_code == 200, resp.text
    answer = tmp_path / "answer.tif"
    answer.write_bytes(resp.content)
    valid, errors, _ = cog_validate(str(answer), quiet=True)
    assert valid, errors
    np.testing.assert_array_equal(read(answer)[0], offline(path))
