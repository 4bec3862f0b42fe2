"""Multimodal requests over HTTP, on a real uvicorn: JSON dicts, one multipart part per
modality, and vLLM's TerraMind request shape on ``/pooling``; each answer equal to the same
request run offline, and every input of every modality behind the same guards."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio
import torch

from geoserve import Engine
from geoserve.processors import Modality, MultimodalPatcher, RawReassembler
from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY
from tests.conftest import serve_ranges
from tests.multimodal_scenes import write_s1, write_s2
from tests.server.conftest import running_server

SIZE = 96


class Fusion(torch.nn.Module):
    """Returns the S2 bands, then VV where given (else -1): shows which modalities came."""

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        s1 = x["s1"] if "s1" in x else torch.full_like(x["s2"][:, :1], -1.0)
        return torch.cat([x["s2"], s1], dim=1)


def _register() -> None:
    if "test-fusion" in MODEL_REGISTRY:
        return
    proc = MultimodalPatcher(
        modalities=(
            Modality("s2", bands=("B3", "B8")),
            Modality("s1", bands=("VV",), required=False, fill=float("nan")),
        ),
        patch_size=32,
    )
    factory = OUTPUT_REGISTRY.register_output_processor(RawReassembler())(Fusion)
    factory = INPUT_REGISTRY.register_input_processor(proc)(factory)
    MODEL_REGISTRY.register_model("test-fusion", description="multimodal test model")(factory)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("modalities")
    write_s2(root / "s2.tif", SIZE)
    write_s1(root / "s1.tif", SIZE)
    return root


@pytest.fixture(scope="module")
def ranges(scenes: Path) -> Iterator[str]:
    with serve_ranges(scenes) as (base, _):
        yield base


@pytest.fixture(scope="module")
def server(scenes: Path) -> Iterator[str]:
    with running_server(
        model="identity",
        allowed_input_dirs=[scenes],
        allowed_url_domains=["127.0.0.1"],
        patch_size=32,
        max_batch_patches=8,
    ) as url:
        yield url


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def offline(scenes: Path) -> np.ndarray:
    eng = Engine("identity", patch_size=32)
    out = eng.generate_image(
        {"s2": str(scenes / "s2.tif"), "s1": str(scenes / "s1.tif")}, out_format="tensor"
    )
    return out.outputs.tensor.numpy()


def _decode(b64: str) -> np.ndarray:
    with rasterio.MemoryFile(base64.b64decode(b64)) as mem, mem.open() as src:
        return src.read()


def test_json_dict_of_paths_equals_offline(client, scenes, offline):
    body = {
        "data": {"s2": str(scenes / "s2.tif"), "s1": str(scenes / "s1.tif")},
        "data_format": "path",
    }
    resp = client.post("/v1/images", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["count"] == 6
    np.testing.assert_array_equal(_decode(resp.json()["data"]), offline)


def test_json_dict_of_urls_read_in_place(client, ranges, offline):
    body = {"data": {"s2": f"{ranges}/s2.tif", "s1": f"{ranges}/s1.tif"}, "data_format": "url"}
    resp = client.post("/v1/images", json=body)
    assert resp.status_code == 200, resp.text
    np.testing.assert_array_equal(_decode(resp.json()["data"]), offline)


def test_multipart_one_part_per_modality(client, scenes, offline):
    files = [
        ("s2", ("s2.tif", (scenes / "s2.tif").read_bytes(), "image/tiff")),
        ("s1", ("s1.tif", (scenes / "s1.tif").read_bytes(), "image/tiff")),
    ]
    resp = client.post("/v1/images", files=files)
    assert resp.status_code == 200, resp.text
    with rasterio.MemoryFile(resp.content) as mem, mem.open() as src:
        np.testing.assert_array_equal(src.read(), offline)
        with rasterio.open(scenes / "s2.tif") as s2:
            assert src.crs == s2.crs  # the first modality's grid
            assert src.transform == s2.transform


def test_pooling_terramind_request_shape(client, ranges, offline):
    request = {
        "model": "identity",
        "data": {
            "data": {"s2": f"{ranges}/s2.tif", "s1": f"{ranges}/s1.tif"},
            "data_format": "url",
            "out_data_format": "b64_json",
        },
    }
    resp = client.post("/pooling", json=request)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body["data"]) == {"data_format", "data", "request_id"}
    np.testing.assert_array_equal(_decode(body["data"]["data"]), offline)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"data": {"s2": "s2.tif", "s1": "/etc/passwd"}, "data_format": "path"}, 403, "outside"),
        ({"data": {"s2": "s2.tif", "s1": "../s1.tif"}, "data_format": "path"}, 403, "outside"),
        (
            {
                "data": {"s1": ["http://127.0.0.1:9/a.tif", "http://example.com/a.tif"]},
                "data_format": "url",
            },
            403,
            "not an allowed",
        ),
        ({"data": {"s2": "s2.tif", "bad name": "s1.tif"}, "data_format": "path"}, 422, "data"),
        ({"data": {}, "data_format": "path"}, 422, "data"),
        (
            {"data": {"s2": "s2.tif"}, "data_format": "path", "dates": ["2020-01-01"]},
            400,
            "dict of modality",
        ),
        (
            {"data": {"s2": "s2.tif"}, "data_format": "path", "dates": {"s1": "2020-01-01"}},
            400,
            "no modality 's1'",
        ),
    ],
)
def test_bad_modalities_are_refused_naming_them(client, body, status, needle):
    resp = client.post("/v1/images", json=body)
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["message"]


def test_multipart_mixing_file_and_modality_parts_refused(client, scenes):
    data = (scenes / "s2.tif").read_bytes()
    files = [("file", ("a.tif", data, "image/tiff")), ("s1", ("b.tif", data, "image/tiff"))]
    resp = client.post("/v1/images", files=files)
    assert resp.status_code == 400
    assert "mixes 'file' parts with modality parts" in resp.json()["message"]


def test_a_multimodal_model_served(scenes):
    _register()
    s2, s1 = str(scenes / "s2.tif"), str(scenes / "s1.tif")
    want = Engine("test-fusion").generate_image({"s2": s2, "s1": s1}, out_format="tensor")
    with running_server(model="test-fusion", allowed_input_dirs=[scenes]) as url:
        models = httpx.get(f"{url}/v1/models").json()["data"][0]["input"]
        assert [m["name"] for m in models["modalities"]] == ["s2", "s1"]
        assert [m["required"] for m in models["modalities"]] == [True, False]
        files = [
            ("s1", ("s1.tif", Path(s1).read_bytes(), "image/tiff")),
            ("s2", ("s2.tif", Path(s2).read_bytes(), "image/tiff")),
        ]
        resp = httpx.post(f"{url}/v1/images", files=files, timeout=60)
        assert resp.status_code == 200, resp.text
        with rasterio.MemoryFile(resp.content) as mem, mem.open() as src:
            got = src.read()
        np.testing.assert_array_equal(got, want.outputs.tensor.numpy())
        only_s2 = httpx.post(
            f"{url}/v1/images", timeout=60, json={"data": {"s2": s2}, "data_format": "path"}
        )
        assert only_s2.status_code == 200, only_s2.text
        vv = _decode(only_s2.json()["data"])[2]
        assert np.all(vv[np.isfinite(vv)] == -1.0)  # the optional modality was absent
        for data, needle in (
            ({"s1": s1}, "modality 's2' is missing"),
            ({"s2": s2, "dem": s1}, "unknown modality 'dem'"),
        ):
            resp = httpx.post(f"{url}/v1/images", json={"data": data, "data_format": "path"})
            assert resp.status_code == 400, resp.text
            assert needle in resp.json()["message"]
            assert "Traceback" not in resp.text
        # one plain file is the first modality (the only required one)
        buf = io.BytesIO(Path(s2).read_bytes())
        single = httpx.post(f"{url}/v1/images", files={"file": ("s2.tif", buf, "image/tiff")})
        assert single.status_code == 200, single.text
        with rasterio.MemoryFile(single.content) as mem, mem.open() as src:
            np.testing.assert_array_equal(src.read(), _decode(only_s2.json()["data"]))


def test_a_fine_modality_is_costed_at_its_own_size(scenes, tmp_path):
    """A small upload of a huge, very compressible modality onto a small reference grid: the
    warper would hold all of it; the size guard counts it at its own size."""
    big = tmp_path / "big.tif"
    with rasterio.open(scenes / "s2.tif") as ref:
        crs, t = ref.crs, ref.transform
    profile = {"driver": "GTiff", "width": 2000, "height": 2000, "count": 1, "dtype": "uint8",
               "crs": crs, "transform": rasterio.Affine(t.a / 20, 0, t.c, 0, t.e / 20, t.f),
               "tiled": True, "compress": "deflate"}  # fmt: skip
    with rasterio.open(big, "w", **profile) as dst:
        dst.write(np.zeros((1, 2000, 2000), np.uint8))
    files = [
        ("s2", ("s2.tif", (scenes / "s2.tif").read_bytes(), "image/tiff")),
        ("fine", ("big.tif", big.read_bytes(), "image/tiff")),
    ]
    with running_server(model="identity", max_pixels=1_000_000, patch_size=32) as url:
        resp = httpx.post(f"{url}/v1/images", files=files, timeout=60)
        assert resp.status_code == 413, resp.text
        assert "input(s) together" in resp.json()["message"]
        odd = [("s2", ("s2.tif", b"x", "image/tiff")), ("ñ", ("b.tif", b"x", "image/tiff"))]
        resp = httpx.post(f"{url}/v1/images", files=odd, timeout=60)
        assert resp.status_code == 400
        assert "is not a modality name" in resp.json()["message"]
