"""``geoserve serve`` takes every engine option, from flags and from ``--config FILE``."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile
from rasterio.windows import Window

from geoserve import Engine, EngineConfig
from geoserve.cli import build_parser, main
from geoserve.cli.serve import server_settings
from geoserve.errors import ConfigError
from geoserve.server import ServerSettings, create_app
from tests.conftest import LAKE, write_geotiff
from tests.hub_cache import REF, fill_cache, offline
from tests.server.conftest import free_port, running_server


def test_tiling_and_output_kind_from_a_file_and_flags_reach_the_server(tmp_path):
    scene = write_geotiff(
        tmp_path / "s.tif", np.random.default_rng(2).integers(0, 400, (3, 41, 29)).astype(np.uint16)
    )
    conf = tmp_path / "serve.yaml"
    conf.write_text(
        "model: test-seg\noutput_kind: probabilities\npatch_size: 20\nstride: 8\n"
        "max_queued_patches: 500\n"
    )
    argv = ["serve", "--config", str(conf), "--stride", "10", "--blend", "mean"]
    settings = server_settings(build_parser().parse_args([*argv, "--port", str(free_port())]))
    assert settings.max_queued_patches == 500  # a server field from the file
    with running_server(**settings.model_dump()) as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert model["input"]["patch_size"] == 20
        assert model["input"]["stride"] == 10  # the flag over the file
        assert model["output"]["kind"] == "probabilities"
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", scene.read_bytes())})
    assert resp.status_code == 200, resp.text
    with MemoryFile(resp.content) as mem, mem.open() as ds:
        got = ds.read()
    config = EngineConfig(output_kind="probabilities", patch_size=20, stride=10, blend="mean")
    want = Engine("test-seg", config).generate_image(scene, out_format="tensor")
    np.testing.assert_allclose(got, want.outputs.tensor.numpy(), rtol=1e-5)


def test_hub_weights_need_allow_hub_weights_and_then_are_served(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "hub"
    fill_cache(cache)
    offline(monkeypatch, cache)
    parse = build_parser().parse_args
    with pytest.raises(ConfigError, match="--allow-hub-weights") as info:
        server_settings(parse(["serve", "-m", "test-seg", "--weights", REF]))
    assert f"weights {REF!r} is a Hub reference" in str(info.value)
    conf = tmp_path / "serve.yaml"
    conf.write_text(f"model: test-seg\nweights: {REF}\n")
    with pytest.raises(ConfigError, match="--allow-hub-weights"):
        server_settings(parse(["serve", "--config", str(conf)]))
    with pytest.raises(ConfigError, match="--allow-hub-weights"):  # Python callers too
        create_app(ServerSettings(model="test-seg", weights=REF))
    from geoserve.distributed.serving import serve_on_ray

    with pytest.raises(ConfigError, match="--allow-hub-weights"):  # before Ray starts
        serve_on_ray(ServerSettings(model="test-seg", weights=REF))
    # the command refuses at start-up with one line, before it listens or loads anything
    assert main(["serve", "-m", "test-seg", "--weights", REF, "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("geoserve: error: weights ")
    assert "--allow-hub-weights" in err
    assert "Traceback" not in err

    argv = ["serve", "--config", str(conf), "--allow-hub-weights", "--port", str(free_port())]
    settings = server_settings(parse(argv))
    assert settings.allow_hub_weights
    assert settings.engine.weights == REF
    scene = write_geotiff(
        tmp_path / "s.tif", np.random.default_rng(3).integers(0, 400, (3, 30, 26)).astype(np.uint16)
    )
    with running_server(**settings.model_dump()) as url:
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", scene.read_bytes())})
        # a request cannot name weights: the server's own configuration is the only source
        body = {"data": base64.b64encode(scene.read_bytes()).decode(), "options": {"weights": REF}}
        refused = httpx.post(f"{url}/v1/images", json=body)
    assert resp.status_code == 200, resp.text
    assert refused.status_code == 422
    assert "weights" in refused.json()["message"]
    with MemoryFile(resp.content) as mem, mem.open() as ds:
        got = ds.read()
    engine = Engine("test-seg", weights=REF)
    assert engine.model.conv.bias.tolist() == [3.0] * 4  # the cached file's, not the defaults
    want = engine.generate_image(scene, out_format="tensor").outputs.tensor.numpy()
    np.testing.assert_array_equal(got, want)


def test_int8_from_a_flag_is_served_and_reported(tmp_path):
    crop = tmp_path / "crop.tif"
    with rasterio.open(LAKE) as src:
        window = Window(600, 200, 300, 260)
        profile = {**src.profile, "width": 300, "height": 260}
        profile["transform"] = src.window_transform(window)
        with rasterio.open(crop, "w", **profile) as dst:
            dst.write(src.read(window=window))
    argv = ["serve", "-m", "demo-water", "--quantize", "int8", "--port", str(free_port())]
    settings = server_settings(build_parser().parse_args(argv))
    with running_server(**settings.model_dump()) as url:
        runtime = httpx.get(f"{url}/v1/models").json()["data"][0]["runtime"]
        resp = httpx.post(f"{url}/v1/images", files={"file": ("crop.tif", crop.read_bytes())})
    assert runtime.pop("weights_mb") > 0
    assert runtime == {
        "device": "cpu",
        "dtype": None,
        "quantize": "int8",
        "compile": False,
        "validated": ["int8"],
        "backend": "torch",
        "precision": "fp32",
    }
    assert resp.status_code == 200, resp.text
    with MemoryFile(resp.content) as mem, mem.open() as ds:
        got = ds.read(1)
    int8 = Engine("demo-water", quantize="int8").generate_image(crop, out_format="tensor")
    fp32 = Engine("demo-water").generate_image(crop, out_format="tensor")
    np.testing.assert_array_equal(got, int8.outputs.tensor[0].numpy())  # per patch: exact
    assert (got == fp32.outputs.tensor[0].numpy()).mean() >= 0.99


def test_the_basemap_is_an_xyz_template_on_http(capsys):
    port = str(free_port())
    for bad in ("javascript:alert(1)", "https://tiles.example.org/a.png", "file:///etc/{z}{x}{y}"):
        assert main(["serve", "--ui", "--basemap-url", bad, "--port", port]) != 0
        assert "basemap" in capsys.readouterr().err
    args = ["serve", "--basemap-url", "https://t.example.org/{z}/{x}/{y}.png", "--port", port]
    settings = server_settings(build_parser().parse_args(args))
    assert settings.basemap_url == "https://t.example.org/{z}/{x}/{y}.png"
