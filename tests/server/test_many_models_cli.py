"""Several models from ``geoserve serve``'s flags and config file; the client and CLI against
a server of several models; map tiles with ``model=``."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio
import uvicorn

import geoserve
from geoserve import Engine
from geoserve.cli import build_parser, main
from geoserve.cli.serve import server_settings
from geoserve.errors import ConfigError
from geoserve.server import ServerSettings, create_app
from tests.conftest import LAKE, write_geotiff
from tests.server.conftest import free_port, running_server
from tests.server.test_tiles import lake_centre, lake_zoom, tile_of


def settings_of(*argv: str) -> ServerSettings:
    return server_settings(build_parser().parse_args(["serve", *argv]))


def test_model_star_serves_every_model_that_needs_no_weights_file(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from geoserve.models.configured import unregister_configured
    from tests.test_cli_configured import write_fine_tune

    request.addfinalizer(lambda: unregister_configured("star-fine-tune"))
    write_fine_tune(tmp_path / "models" / "star-fine-tune")
    every = settings_of("--model", "*", "--models-dir", str(tmp_path / "models"))
    names = every.model_names
    assert {"demo-water", "ndwi-water", "identity", "test-seg", "star-fine-tune"} <= set(names)
    assert not [n for n in names if n.startswith("prithvi-")]  # (they need --weights)
    assert not [n for n in names if n.startswith("terramind-")]  # (from the Hub: not asked for)
    hub = settings_of("--model", "*", "--allow-hub-weights").model_names
    assert "terramind-v1-tiny-generate" in hub
    # '*' after a name: that one first (the default model), the rest once each
    first = settings_of("--model", "ndwi-water", "--model", "*", "--max-loaded-models", "2")
    assert first.model == "ndwi-water"
    assert first.model_names[0] == "ndwi-water"
    assert first.model_names.count("ndwi-water") == 1
    # ... and served: lazily, within the budget, each model on its first request
    s2 = ["B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B9", "B10", "B11", "B12"]
    data = np.random.default_rng(2).integers(0, 3000, (13, 40, 40)).astype(np.uint16)
    scene = write_geotiff(tmp_path / "s.tif", data, descriptions=s2)
    with running_server(
        model=first.model, models=first.models, max_loaded_models=2, models_dir=tmp_path / "models"
    ) as url:
        for model in ("ndwi-water", "identity", "demo-water"):
            resp = httpx.post(
                f"{url}/v1/images",
                files={"file": ("s.tif", scene.read_bytes())},
                data={"model": model},
                timeout=60,
            )
            assert resp.status_code == 200, (model, resp.text)
        loaded = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"] if m["loaded"]]
        assert sorted(loaded) == ["demo-water", "identity"]


def test_repeated_model_flags_and_a_models_list_with_options_per_model(tmp_path: Path) -> None:
    two = settings_of("--model", "test-seg", "--model", "identity", "--batch-size", "4")
    assert two.model_names == ["test-seg", "identity"]
    assert two.model == "test-seg"
    assert [m.engine.max_batch_patches for m in two.served] == [4, 4]
    one = settings_of("--model", "identity")  # one model: as it always was
    assert (one.model, one.models, one.model_names) == ("identity", [], ["identity"])

    conf = tmp_path / "serve.yaml"
    conf.write_text(
        "max_batch_patches: 8\ndtype: float32\noutput_dir: out\nmodels:\n"
        "  - test-seg\n"
        "  - name: identity\n    max_batch_patches: 2\n    patch_size: 32\n"
        "    output_kind: [raw]\n"
    )
    listed = settings_of("--config", str(conf), "--stride", "8")
    assert listed.model_names == ["test-seg", "identity"]
    seg, ident = listed.served
    assert (seg.engine.max_batch_patches, seg.engine.stride, seg.engine.patch_size) == (8, 8, None)
    assert (ident.engine.max_batch_patches, ident.engine.patch_size) == (2, 32)
    assert ident.engine.stride == 8
    assert ident.engine.dtype == "float32"
    assert ident.engine.output_kind == ["raw"]
    assert listed.output_dir == tmp_path / "out"
    # flags name the models: the file's options kept for those it lists
    chosen = settings_of("--config", str(conf), "-m", "identity", "-m", "test-steps")
    assert chosen.model_names == ["identity", "test-steps"]
    assert chosen.engine_of("identity").patch_size == 32
    assert chosen.engine_of("test-steps").max_batch_patches == 8

    for body, said in (
        ("models:\n  - name: identity\n    batch: 2\n", "models[0] (identity): batch"),
        ("models:\n  - name: identity\n    max_batch_patches: 0\n", "max_batch_patches"),
        ("models:\n  - name: identity\n    output_dir: x\n", "set it at the top level"),
        ("models:\n  - max_batch_patches: 2\n", "models[0]: name"),
        ("models: identity\n", "models: a list"),
        ("models: [identity, identity]\n", "identity listed more than once"),
        ("model: test-seg\nmodels: [identity]\n", "'test-seg' is not one of models"),
    ):
        conf.write_text(body)
        with pytest.raises(ConfigError) as info:
            settings_of("--config", str(conf))
        assert said in str(info.value), (body, str(info.value))
        if "[0]" in said:
            assert str(conf) in str(info.value)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("many_cli_outputs")
    with running_server(model="test-seg", models=["test-seg", "identity"], output_dir=out) as url:
        yield url


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = np.random.default_rng(9).integers(0, 400, (3, 30, 41)).astype(np.uint16)
    return write_geotiff(tmp_path_factory.mktemp("many_cli_inputs") / "s.tif", data)


def test_client_submits_to_the_model_it_names(two: str, scene: Path, tmp_path: Path) -> None:
    with geoserve.Client(two) as client:
        assert [m["id"] for m in client.models()] == ["test-seg", "identity"]
        assert client.model("identity")["output"]["kinds"] == ["raw"]
        with pytest.raises(ConfigError, match="serves 2 models"):
            client.model()
        with pytest.raises(ConfigError, match="serves models test-seg, identity, not 'nope'"):
            client.submit(scene, model="nope")
        paths = client.run(scene, tmp_path / "job", model="identity")
    with rasterio.open(paths["raw"]) as ds:
        got = ds.read()
    want = Engine("identity").generate_image(scene, out_format="tensor").outputs.tensor
    np.testing.assert_array_equal(got, want.numpy())


def test_cli_models_and_predict_against_a_server_of_two(
    two: str, scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "--server", two]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["test-seg", "identity"]
    assert "  loaded  " in lines[0]
    assert "output classes" in lines[0]
    out = tmp_path / "o.tif"
    assert main(["predict", str(scene), "-o", str(out), "--server", two, "-q"]) == 1
    assert "serves 2 models (test-seg, identity); choose one with --model" in (
        capsys.readouterr().err
    )
    argv = ["predict", str(scene), "-o", str(out), "--server", two, "--model", "test-seg"]
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    want = Engine("test-seg").generate_image(scene, out_format="tensor").outputs.tensor
    with rasterio.open(out) as ds:
        np.testing.assert_array_equal(ds.read(), want.numpy())
    assert main([*argv[:-1], "nope"]) == 1
    assert "--model nope: the server at" in capsys.readouterr().err


def test_tiles_name_their_model_and_match_a_one_model_server() -> None:
    z = lake_zoom() + 1
    x, y = tile_of(*lake_centre(), z)
    path = f"/v1/tiles/{z}/{x}/{y}.png"
    params = {"source": str(LAKE)}
    alone = {}
    for model in ("demo-water", "ndwi-water"):
        with running_server(model=model, allowed_input_dirs=[LAKE.parent]) as url:
            alone[model] = httpx.get(url + path, params=params, timeout=60).content
    assert alone["demo-water"] != alone["ndwi-water"]
    with running_server(
        model="demo-water", models=["demo-water", "ndwi-water"], allowed_input_dirs=[LAKE.parent]
    ) as url:
        for model in ("ndwi-water", "demo-water"):
            resp = httpx.get(url + path, params={**params, "model": model}, timeout=60)
            assert resp.status_code == 200, resp.text
            assert resp.content == alone[model], model
        assert httpx.get(url + path, params=params).status_code == 400
        unknown = httpx.get(url + path, params={**params, "model": "nope"})
        assert unknown.status_code == 404
        assert "demo-water, ndwi-water" in unknown.json()["message"]


def test_a_model_that_fails_to_load_leaves_the_others_answering(scene: Path) -> None:
    settings = ServerSettings(model="test-seg", models=["test-seg", "no-such-model"], port=0)
    app = create_app(settings)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = httpx.get(f"{url}/health/ready").json()
                if ready["status"] == "failed":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the failed load was never reported"
            time.sleep(0.1)
        assert "no-such-model" in ready["message"]
        files = {"file": ("s.tif", scene.read_bytes())}
        ok = httpx.post(f"{url}/v1/images", files=files, data={"model": "test-seg"}, timeout=60)
        assert ok.status_code == 200, ok.text
        bad = httpx.post(f"{url}/v1/images", files=files, data={"model": "no-such-model"})
        assert bad.status_code == 500  # (the server's fault, not the request's)
        assert "model 'no-such-model' failed to load" in bad.json()["message"]
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert [(m["id"], m["ready"]) for m in models] == [
            ("test-seg", True),
            ("no-such-model", False),
        ]
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def test_demo_ndwi_and_a_fine_tune_answer_as_their_own_one_model_servers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three models at once (two built in, one TerraTorch fine-tune of --models-dir)."""
    from rasterio.windows import Window

    from geoserve.models.configured import unregister_configured
    from tests.test_cli_configured import write_fine_tune, write_scene

    request.addfinalizer(lambda: unregister_configured("three-ft"))
    models = tmp_path / "models"
    write_fine_tune(models / "three-ft")
    with rasterio.open(LAKE) as src:
        profile = {**src.profile, "width": 96, "height": 80}
        profile.pop("blockxsize", None), profile.pop("blockysize", None), profile.pop("tiled", None)
        window = Window(200, 150, 96, 80)
        with rasterio.open(tmp_path / "lake.tif", "w", **profile) as dst:
            dst.write(src.read(window=window))
            dst.transform = src.window_transform(window)
            dst.descriptions = src.descriptions
    scenes = {
        "demo-water": tmp_path / "lake.tif",
        "ndwi-water": tmp_path / "lake.tif",
        "three-ft": write_scene(tmp_path / "six.tif"),
    }

    def answer(url: str, model: str, name: bool) -> bytes:
        body = {"data": str(scenes[model]), "data_format": "path", "out_data_format": "b64_json"}
        resp = httpx.post(f"{url}/v1/images", json=body | ({"model": model} if name else {}))
        assert resp.status_code == 200, (model, resp.text)
        return base64.b64decode(resp.json()["data"])

    alone = {}
    for model in scenes:
        with running_server(model=model, models_dir=models, allowed_input_dirs=[tmp_path]) as url:
            alone[model] = answer(url, model, name=False)
    assert alone["demo-water"] != alone["ndwi-water"]  # (one scene, two maps)
    with running_server(
        model="demo-water", models=list(scenes), models_dir=models, allowed_input_dirs=[tmp_path]
    ) as url:
        for model in scenes:
            assert answer(url, model, name=True) == alone[model], model
