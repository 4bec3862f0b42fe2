"""Generation over HTTP: a real uvicorn on 127.0.0.1 serving ``test-generate`` (TerraMind's
generation code at toy width, tests/generate_stub.py).

The server generates what its output kinds name; a request picks any of them, with its seed,
and gets exactly what the local engine writes for that seed; a kind the server does not
generate is a 400 naming the ones it does.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from geoserve import Engine
from tests.models.terramind.test_generate_served import write_scene
from tests.server.conftest import running_server
from tests.server.test_app import b64, decode

KINDS = ["s1grd", "lulc"]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return write_scene(tmp_path_factory.mktemp("gen_http") / "s2.tif")


@pytest.fixture(scope="module")
def url():
    with running_server(model="test-generate", output_kind=KINDS, warmup=False) as base:
        yield base


def _local(scene, seed: int) -> dict[str, np.ndarray]:
    with Engine("test-generate", output_kind=KINDS, warmup=False) as engine:
        out = engine.generate_image({"S2L2A": str(scene)}, out_format="tensor", seed=seed)
    return {k: o.tensor.numpy() for k, o in out.outputs_by_kind.items()}


def _post(url: str, scene, **options) -> httpx.Response:
    body = {"data": {"S2L2A": b64(scene)}, "out_data_format": "b64_json", "options": options}
    return httpx.post(f"{url}/v1/images", json=body, timeout=120)


def test_a_request_gets_the_products_of_its_seed(url, scene) -> None:
    resp = _post(url, scene, output_kinds=KINDS, seed=11)
    assert resp.status_code == 200, resp.text
    outputs = resp.json()["outputs"]
    assert list(outputs) == KINDS
    got = {k: decode(base64.b64decode(outputs[k]["data"])) for k in KINDS}
    want = _local(scene, 11)
    for kind in KINDS:
        data, profile = got[kind]
        np.testing.assert_array_equal(data.squeeze(), want[kind].squeeze())
    assert got["lulc"][1]["dtype"] == "uint8"
    assert got["s1grd"][1]["count"] == 2
    again = _post(url, scene, output_kinds=["lulc"], seed=12)
    assert again.status_code == 200, again.text
    other, _ = decode(base64.b64decode(again.json()["data"]))
    assert not np.array_equal(other, got["lulc"][0])  # another seed, another sample


def test_a_kind_the_server_does_not_generate_is_refused_by_name(url, scene) -> None:
    resp = _post(url, scene, output_kind="dem")
    assert resp.status_code == 400, resp.text
    detail = str(resp.json())
    assert "dem" in detail
    assert "s1grd, lulc" in detail
    assert "Traceback" not in detail
    assert _post(url, scene, output_kind="lulc").status_code == 200  # it goes on serving


def test_a_request_sets_its_own_temperature(url, scene) -> None:
    resp = _post(url, scene, output_kinds=KINDS, seed=4, temperature=0.0)
    assert resp.status_code == 200, resp.text
    with Engine("test-generate", output_kind=KINDS, temperature=0.0, warmup=False) as engine:
        want = engine.generate_image({"S2L2A": str(scene)}, out_format="tensor", seed=4)
    for kind in KINDS:
        data, _ = decode(base64.b64decode(resp.json()["outputs"][kind]["data"]))
        np.testing.assert_array_equal(
            data.squeeze(), want.outputs_by_kind[kind].tensor.numpy().squeeze()
        )
    bad = _post(url, scene, top_p=2.0)
    assert bad.status_code == 400, bad.text
    assert "top_p" in bad.text
