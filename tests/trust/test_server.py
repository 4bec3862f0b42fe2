"""The server's side of the trust boundary, against a real uvicorn on 127.0.0.1.

Each way a client can hand the server a VRT (upload, base64, a path inside an allowed
directory, a URL on an allowed host, read in place or downloaded) is refused with a 400 that
names the format, and leaves the bait untouched. Client-chosen request ids never become keys.
"""

from __future__ import annotations

import asyncio
import base64
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import read, serve_ranges, write_geotiff
from tests.server.conftest import API_KEY, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tmp_path_factory.mktemp("allowed"), tmp_path_factory.mktemp("out")


@pytest.fixture(scope="module", params=["range", "download"])
def server(request: pytest.FixtureRequest, dirs: tuple[Path, Path]) -> Iterator[str]:
    allowed, out = dirs
    with running_server(
        model="identity",
        allowed_input_dirs=[allowed],
        allowed_url_domains=["127.0.0.1"],
        url_reads=request.param,
        output_dir=out,
        api_key=API_KEY,
    ) as url:
        yield url


def _refused(resp: httpx.Response) -> None:
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["type"] == "InputFormatError"
    assert "GDAL virtual raster (VRT)" in body["message"]
    assert "allowed input formats: GTiff" in body["message"]
    assert "TOP-SECRET" not in resp.text


def test_uploaded_vrt(server, bait):
    resp = httpx.post(
        f"{server}/v1/images", files={"file": ("x.tif", bait.vrt())}, headers=AUTH, timeout=30
    )
    _refused(resp)
    resp = httpx.post(
        f"{server}/v1/images",
        files={"file": ("x.tif", bait.vrt(only_secret=True))},
        headers=AUTH,
        timeout=30,
    )
    _refused(resp)
    assert bait.untouched()


def test_base64_vrt_on_both_routes(server, bait):
    b64 = base64.b64encode(bait.vrt()).decode()
    _refused(httpx.post(f"{server}/v1/images", json={"data": b64}, headers=AUTH, timeout=30))
    pooling = {"data": {"data": b64, "data_format": "b64_json"}}
    _refused(httpx.post(f"{server}/pooling", json=pooling, headers=AUTH, timeout=30))
    assert bait.untouched()


@pytest.mark.parametrize("name", ["inside.vrt", "inside.tif"])
def test_vrt_inside_an_allowed_directory(server, bait, dirs, name):
    (dirs[0] / name).write_bytes(bait.vrt())
    body = {"data": name, "data_format": "path"}
    _refused(httpx.post(f"{server}/v1/images", json=body, headers=AUTH, timeout=30))
    assert bait.untouched()


def test_vrt_served_from_an_allowed_host(server, bait, tmp_path):
    (tmp_path / "scene.tif").write_bytes(bait.vrt())
    (tmp_path / "scene.vrt").write_bytes(bait.vrt())
    with serve_ranges(tmp_path) as (base, log):
        for name in ("scene.tif", "scene.vrt"):
            body = {"data": f"{base}/{name}", "data_format": "url"}
            _refused(httpx.post(f"{server}/v1/images", json=body, headers=AUTH, timeout=30))
    assert log  # the allowed host was asked, and nothing else
    assert bait.untouched()


def test_same_client_request_id_never_mixes_two_requests(server, dirs, tmp_path):
    """Two concurrent requests with one X-Request-Id each get their own result and file."""
    rng = np.random.default_rng(3)
    scenes = [rng.integers(0, 999, (1, 40 + 8 * i, 48)).astype(np.uint16) for i in range(2)]
    raws = [write_geotiff(tmp_path / f"s{i}.tif", s).read_bytes() for i, s in enumerate(scenes)]

    async def both(out_format: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, headers=AUTH, timeout=60) as ac:
            return list(
                await asyncio.gather(
                    *(
                        ac.post(
                            "/v1/images",
                            json={
                                "data": base64.b64encode(r).decode(),
                                "out_data_format": out_format,
                            },
                            headers={"X-Request-Id": "same-id"},
                        )
                        for r in raws
                    )
                )
            )

    for out_format in ("b64_json", "path"):
        answers = asyncio.run(both(out_format))
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert [a.headers["x-request-id"] for a in answers] == ["same-id", "same-id"]
        ids = {a.json()["request_id"] for a in answers}
        assert len(ids) == 2
        assert "same-id" not in ids
        for scene, answer in zip(scenes, answers, strict=True):
            data = answer.json()["data"]
            if out_format == "path":
                assert Path(data).parent == dirs[1]
                got = read(data)[0]
            else:
                path = tmp_path / "got.tif"
                path.write_bytes(base64.b64decode(data))
                got = read(path)[0]
            np.testing.assert_array_equal(got, scene.astype(np.float32))


def test_an_upload_of_several_mb_is_parsed_in_memory_and_nothing_goes_to_disk(
    server, tmp_path, monkeypatch
):
    """A multipart file part over 1 MB never becomes a temporary file (Starlette's parser
    spools such parts to one by default): a request writes only under --output-dir."""
    made: list[object] = []
    real = tempfile.TemporaryFile

    def counted(*args, **kwargs):
        made.append(kwargs.get("dir"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", counted)
    scene = np.random.default_rng(11).integers(0, 999, (3, 600, 600)).astype(np.uint16)
    raw = write_geotiff(tmp_path / "big.tif", scene).read_bytes()
    assert len(raw) > 2 * 1024 * 1024
    resp = httpx.post(
        f"{server}/v1/images",
        files={"file": ("big.tif", raw)},
        data={"out_data_format": "b64_json"},
        headers=AUTH,
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert made == []
    path = tmp_path / "got.tif"
    path.write_bytes(base64.b64decode(resp.json()["data"]))
    np.testing.assert_array_equal(read(path)[0], scene.astype(np.float32))


def test_a_malformed_multipart_body_is_a_400_naming_the_problem(server):
    resp = httpx.post(
        f"{server}/v1/images",
        content=b"--x\r\nno headers here",
        headers={**AUTH, "content-type": "multipart/form-data"},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    assert "multipart" in resp.json()["message"]
