"""``backend: openvino``: demo-water converted, quantised, gated and cached, on the real scene.

Every engine here shares one conversion cache (a module-scoped folder), so demo-water is
converted once per precision (seconds) and the later engines reuse it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from geoserve import Engine  # noqa: E402
from geoserve.accuracy import compare_settings  # noqa: E402
from geoserve.cli import main  # noqa: E402
from geoserve.config import EngineConfig  # noqa: E402
from geoserve.engine.converted_cache import converted_of  # noqa: E402
from geoserve.engine.cpu_inference import cpu_flags  # noqa: E402
from geoserve.engine.openvino_backend import INT8_FLAGS, OpenVinoRunner  # noqa: E402
from geoserve.engine.ov_convert import AccuracyGateWarning, check_gate, run_compiled  # noqa: E402
from geoserve.errors import ConfigError  # noqa: E402

SCENE = Path(__file__).parents[2] / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
SHAPE = (6, 224, 224)  # demo-water's patch


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("converted")


@pytest.fixture(scope="module")
def int8_engine(cache: Path) -> Iterator[Engine]:
    # force_precision: int8 pays only with VNNI/AMX, which this test must not need
    eng = Engine(
        "demo-water",
        backend="openvino",
        precision="int8",
        calibrate=[SCENE],
        force_precision=True,
        backend_cache_dir=cache,
    )
    yield eng
    eng.close()


def _runner(eng: Engine) -> OpenVinoRunner:
    assert isinstance(eng.runner, OpenVinoRunner)
    return eng.runner


def test_fp32_gives_torch_classes_on_the_scene(cache: Path, tmp_path: Path) -> None:
    report = compare_settings(
        "demo-water", SCENE, EngineConfig(backend="openvino", backend_cache_dir=cache)
    )
    assert report.pixels == 1536 * 768
    assert report.class_agreement is not None
    assert report.class_agreement >= 0.999
    assert report.max_abs_error < 1e-3  # float rounding of the same fp32 graph
    assert report.candidate.settings == "backend=openvino"


def test_int8_calibrated_passes_the_gate_and_lists_its_figures(
    int8_engine: Engine, cache: Path, tmp_path: Path
) -> None:
    (converted,) = _runner(int8_engine).converted.values()
    gate = converted.meta["gate"]
    assert gate["patches"] == 32
    assert gate["pixels"] == 32 * 224 * 224
    assert gate["agreement"] >= 0.99
    assert 0 < gate["max_abs_error"] < float("inf")
    assert converted.meta["calibration_s"] > 0
    assert converted.meta["conversion_s"] > 0
    # the figures are stored with the converted model, as `geoserve models --json` lists them
    listed = [m for m in converted_of("demo-water", cache) if m["precision"] == "int8"]
    assert listed
    assert listed[0]["gate"] == gate
    # and the engine serves the scene with it: the water map as torch's, but for a few pixels
    int8_engine.generate_image(str(SCENE), output_path=tmp_path / "int8.tif")
    with Engine("demo-water") as torch_engine:
        torch_engine.generate_image(str(SCENE), output_path=tmp_path / "torch.tif")
    with rasterio.open(tmp_path / "int8.tif") as a, rasterio.open(tmp_path / "torch.tif") as b:
        assert (a.read(1) == b.read(1)).mean() >= 0.99


def test_batch_composition_does_not_change_results(int8_engine: Engine, cache: Path) -> None:
    runner = _runner(int8_engine)
    x = np.stack(runner.patches[:8])
    for precision, engine in (("int8", int8_engine), ("fp32", None)):
        if engine is None:
            engine = Engine("demo-water", backend="openvino", backend_cache_dir=cache)
        compiled = _runner(engine).converted[SHAPE].compiled
        whole = run_compiled(compiled, x)
        alone = np.concatenate([run_compiled(compiled, x[i : i + 1]) for i in range(8)])
        # fixed per-tensor scales (int8) and one graph for every batch size
        np.testing.assert_allclose(alone, whole, atol=1e-4, err_msg=precision)
        # with another patch in place of patch 0, patches 1..7 keep their values
        other = x.copy()
        other[0] = x[7]
        np.testing.assert_allclose(run_compiled(compiled, other)[1:], whole[1:], atol=1e-4)
        if engine is not int8_engine:
            engine.close()


def test_second_engine_reuses_the_conversion(cache: Path) -> None:
    first = Engine("demo-water", backend="openvino", backend_cache_dir=cache)
    folder = _runner(first).converted[SHAPE].folder
    first.close()
    stamp = (folder / "model.xml").stat().st_mtime_ns
    t0 = time.perf_counter()
    second = Engine("demo-water", backend="openvino", backend_cache_dir=cache)
    took = time.perf_counter() - t0
    converted = _runner(second).converted[SHAPE]
    second.close()
    assert converted.reused
    assert converted.folder == folder
    assert (folder / "model.xml").stat().st_mtime_ns == stamp  # not written again
    assert took < converted.meta["conversion_s"] + 30  # (the start-up, not a conversion)


def test_int8_without_calibration_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"precision: int8 .*never on random data.*--calibrate"):
        EngineConfig.build(backend="openvino", precision="int8")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"precision": "int8", "calibrate": [SCENE]}, r"precision: int8 is an openvino"),
        ({"backend": "openvino", "device": "cuda"}, r"backend: openvino runs on the CPU"),
        ({"backend": "openvino", "quantize": "int8"}, r"does not combine with quantize int8"),
    ],
)
def test_options_that_do_not_combine_are_refused(options: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        EngineConfig.build(**options)


@pytest.mark.skipif(bool(set(INT8_FLAGS) & cpu_flags()), reason="this CPU has VNNI/AMX")
def test_int8_on_a_cpu_without_vnni_names_the_flag_that_forces_it(cache: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"int8 needs AVX512-VNNI, AVX-VNNI or AMX.*has none.*--force-precision"
    ):
        Engine(
            "demo-water",
            backend="openvino",
            precision="int8",
            calibrate=[SCENE],
            backend_cache_dir=cache,
        )


def test_a_stepped_model_is_refused(cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"several steps per patch.*one-pass models only"):
        Engine("test-steps", backend="openvino", backend_cache_dir=cache)


def test_token_kinds_are_refused(cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"output_kind: embeddings need the encoder's tokens"):
        Engine(
            "demo-water", backend="openvino", output_kind=["embeddings"], backend_cache_dir=cache
        )


def test_the_gate_refuses_or_warns_under_99_percent() -> None:
    meta = {
        "precision": "int8",
        "gate": {"agreement": 0.95, "max_abs_error": 2.0, "max_rel_error": 0.2},
    }
    with pytest.raises(ConfigError, match=r"95.00 % .*under the 99 % gate.*--accuracy-gate warn"):
        check_gate(meta, "m", "refuse")
    with pytest.warns(AccuracyGateWarning, match="running anyway"):
        check_gate(meta, "m", "warn")
    check_gate({**meta, "gate": {**meta["gate"], "agreement": 0.995}}, "m", "refuse")


def test_cli_predict_with_openvino(cache: Path, tmp_path: Path) -> None:
    out, ref = tmp_path / "ov.tif", tmp_path / "torch.tif"
    argv = ["predict", str(SCENE), "-m", "demo-water", "-q"]
    assert main([*argv, "-o", str(ref)]) == 0
    assert (
        main([*argv, "-o", str(out), "--backend", "openvino", "--backend-cache-dir", str(cache)])
        == 0
    )
    with rasterio.open(out) as a, rasterio.open(ref) as b:
        assert a.profile["width"] == b.profile["width"]
        assert a.crs == b.crs
        same = (a.read(1) == b.read(1)).mean()
    assert same >= 0.999


def test_models_json_lists_the_converted_forms(
    int8_engine: Engine,
    cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    xdg = cache.parent / "xdg"
    (xdg / "geoserve").mkdir(parents=True, exist_ok=True)
    if not (xdg / "geoserve" / "converted").exists():
        (xdg / "geoserve" / "converted").symlink_to(cache)  # the default cache, under XDG
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert main(["models", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    precisions = {c["precision"] for c in entries["demo-water"]["converted"]}
    assert "int8" in precisions
    (int8,) = [c for c in entries["demo-water"]["converted"] if c["precision"] == "int8"]
    assert int8["gate"]["agreement"] >= 0.99


def test_v1_models_says_how_the_server_runs_its_model(cache: Path) -> None:
    """A real uvicorn serving demo-water on openvino: /v1/models names the backend, precision
    and each converted model's figures, never the server's cache paths."""
    import httpx

    from geoserve.config import EngineConfig
    from tests.server.conftest import running_server

    engine = EngineConfig(backend="openvino", backend_cache_dir=cache)
    with running_server(model="demo-water", engine=engine) as url:
        runtime = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["runtime"]
    assert (runtime["backend"], runtime["precision"]) == ("openvino", "fp32")
    assert runtime["converted"]
    assert str(cache) not in str(runtime)


def test_weights_hash_takes_scalar_buffers() -> None:
    """A BatchNorm's ``num_batches_tracked`` (a 0-d int64) is hashed like any tensor: a
    model with batch norm (the UperNet decoders) gets a cache key, and its values count."""
    import torch

    from geoserve.engine.ov_convert import weights_hash

    model = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 1), torch.nn.BatchNorm2d(2))
    before = weights_hash(model)
    model[1].num_batches_tracked += 1
    assert weights_hash(model) != before
    model[1].num_batches_tracked -= 1
    assert weights_hash(model) == before
