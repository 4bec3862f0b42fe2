"""EngineConfig: every engine option reachable from Python, both commands, a file and Ray.

The walker below goes over ``EngineConfig.model_fields``: a new option that is not reachable
from one of them fails here, with the field's name.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from geoserve import EngineConfig
from geoserve.cli import build_parser
from geoserve.cli.options import engine_config, read_options
from geoserve.cli.serve import server_settings
from geoserve.errors import ConfigError

#: A value other than the default for every field (a new field must be added here).
SAMPLE: dict[str, Any] = {
    "weights": Path("weights.safetensors"),
    "device": "cuda:1",
    "dtype": "bf16",
    "quantize": "int8",
    "backend": "openvino",
    "precision": "fp32",
    "calibrate": [Path("scene.tif")],
    "accuracy_gate": "warn",
    "force_precision": True,
    "backend_cache_dir": Path("converted"),
    "threads": 3,
    "patch_size": 32,
    "stride": 16,
    "blend": "mean",
    "bands": [2, "B8"],
    "output_kind": ["probabilities", "confidence"],
    "min_area": 2.5,
    "max_polygon_vertices_per_pixel": 2.5,
    "polygon_format": "geojson",
    "embedding_layer": 3,
    "embedding_dtype": "float16",
    "steps": 12,
    "temperature": 0.5,
    "top_p": 0.25,
    "top_k": 40,
    "batch_invariant": False,
    "max_batch_patches": "auto",
    "compile": True,
    "compile_backend": "eager",
    "share_weights": False,
    "warmup": False,
    "prefetch": False,
    "read_workers": 3,
    "prefetch_rows": 5,
    "preprocess": "device",
    "cross_request_batching": False,
    "streaming": False,
    "cog": True,
    "output_compression": "deflate",
    "output_compression_level": 9,
    "output_dir": Path("outputs"),
    "allowed_formats": ["GTiff", "PNG"],
    "max_patches": 7,
    "max_request_mb": 12.5,
}
FIELDS = list(EngineConfig.model_fields)


def as_flags(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + name.replace("_", "-")]
    if isinstance(value, list):
        return [flag, ",".join(map(str, value))]
    return [flag, str(value)]


def expected(name: str, base: Path) -> Any:
    """The sample as the configuration holds it (relative paths: below ``base``)."""
    value = SAMPLE[name]
    if isinstance(value, list) and value and isinstance(value[0], Path):
        return [base / v for v in value]
    return base / value if isinstance(value, Path) else value


def test_the_sample_covers_every_field_with_a_non_default_value():
    assert set(SAMPLE) == set(FIELDS)
    defaults = EngineConfig()
    for name in FIELDS:
        assert getattr(defaults, name) != SAMPLE[name], name


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    out = {}
    for cmd in ("predict", "serve"):
        text = io.StringIO()
        with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
            build_parser().parse_args([cmd, "--help"])
        out[cmd] = text.getvalue()
    return out


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_reachable_everywhere(name, helps, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    # Python
    assert getattr(EngineConfig(**{name: SAMPLE[name]}), name) == SAMPLE[name]
    assert getattr(EngineConfig.build(**{name: SAMPLE[name]}), name) == SAMPLE[name]
    # both commands' help, and their flags
    flags = as_flags(name, SAMPLE[name])
    for cmd in ("predict", "serve"):
        assert flags[0].replace("--no-", "--") in helps[cmd], (cmd, name)
    args = build_parser().parse_args(["predict", "in.tif", "-o", "out.tif", *flags])
    assert getattr(engine_config(args, {}), name) == SAMPLE[name]
    args = build_parser().parse_args(["serve", *flags])
    assert getattr(server_settings(args).engine, name) == SAMPLE[name]
    # a configuration file, YAML and JSON; relative paths are relative to the file
    listed = name in ("allowed_formats", "calibrate")
    value = [str(v) for v in SAMPLE[name]] if listed else SAMPLE[name]
    value = str(value) if isinstance(value, Path) else value
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "outputs").mkdir()
    for path, text in (
        (conf / "c.yaml", f"{name}: {json.dumps(value)}\n"),
        (conf / "c.json", json.dumps({name: value})),
    ):
        path.write_text(text)
        assert getattr(EngineConfig.from_file(path), name) == SAMPLE[name]
        args = build_parser().parse_args(
            ["predict", "in.tif", "-o", "o.tif", "--config", str(path)]
        )
        file_values = read_options(args.config, dict.fromkeys(FIELDS, EngineConfig))
        assert getattr(engine_config(args, file_values), name) == expected(name, conf)
        args = build_parser().parse_args(["serve", "--config", str(path)])
        assert getattr(server_settings(args).engine, name) == expected(name, conf)


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_reaches_ray(name, tmp_path):
    """run_batch takes the field as an override (validated before any Ray work starts) ..."""
    pytest.importorskip("ray")
    from geoserve.distributed import run_batch

    summary = run_batch([], tmp_path, model="test-seg", **{name: SAMPLE[name]})
    assert summary.results == []
    with pytest.raises(ConfigError, match=name):
        run_batch([], tmp_path, model="test-seg", **{name: object()})
    # ... and the actors run with the config (tests/distributed/test_config_on_ray.py)


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("max_batch_patches: 4\nstride: 8\nmodel: test-seg\ncog: true\n")
    args = build_parser().parse_args(
        ["predict", "a.tif", "-o", "b.tif", "--config", str(path), "--stride", "12", "--no-cog"]
    )
    values = read_options(args.config, {"model": None, **dict.fromkeys(FIELDS, EngineConfig)})
    config = engine_config(args, values)
    assert (config.max_batch_patches, config.stride, config.cog) == (4, 12, False)
    assert config.prefetch_rows == EngineConfig().prefetch_rows
    settings = server_settings(build_parser().parse_args(["serve", "--config", str(path)]))
    assert settings.model == "test-seg"
    settings = server_settings(
        build_parser().parse_args(["serve", "--config", str(path), "-m", "test-id"])
    )
    assert settings.model == "test-id"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_batch_patches: 0\n", "c.yaml: max_batch_patches: should be greater than or equal"),
        ("max_batch_pachtes: 4\n", "unknown option(s) 'max_batch_pachtes'; known: model, weights"),
        ("preprocess: gpu\n", "c.yaml: preprocess: should be 'auto', 'host' or 'device'"),
        ("allowed_formats: [VRT]\n", "c.yaml: allowed_formats: allowed input formats: VRT"),
        ("- 1\n- 2\n", "c.yaml: expected a mapping of option names"),
        ("stride: [1\n", "c.yaml: not valid YAML"),
        ("a: &x [1]\nb: *x\n", "aliases"),
        ("threads: 2\nthreads: 3\n", "'threads' given twice"),
        ("compile: maybe\n", "c.yaml: compile: should be a valid boolean"),
        ("model: [identity]\n", "c.yaml: model: should be a model name"),
        ("output_dir: ''\n", "c.yaml: output_dir: an empty path"),
        ("stride: [1\n", "line 1, column 9"),
    ],
)
def test_a_bad_file_is_named_with_its_key(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    args = build_parser().parse_args(["predict", "a.tif", "-o", "b.tif", "--config", str(path)])

    def load() -> EngineConfig:
        values = read_options(args.config, {"model": None, **dict.fromkeys(FIELDS, EngineConfig)})
        return engine_config(args, values)

    with pytest.raises(ConfigError) as info:
        load()
    assert message in str(info.value)


def test_python_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"^read_workers: should be greater than or equal to 1"):
        EngineConfig.build(read_workers=0)
    with pytest.raises(ConfigError, match="max_batch_pachtes: unknown option; known: weights"):
        EngineConfig.build(max_batch_pachtes=4)
    assert EngineConfig.build(max_patches=0).max_patches is None  # 0: no limit


def test_engine_takes_a_config_and_keyword_overrides():
    import torch

    from geoserve import Engine

    config = EngineConfig(patch_size=32, stride=16, output_kind="probabilities")
    engine = Engine("test-seg", config, max_batch_patches=3, dtype=torch.bfloat16)
    assert engine.config.patch_size == 32
    assert engine.in_proc.patch_size == 32
    assert engine.in_proc.stride == 16
    assert engine.max_batch_patches == 3
    assert engine.config.dtype == "bfloat16"
    assert engine.dtype is torch.bfloat16
    assert engine.out_proc.kind == "probabilities"
    with pytest.raises(ConfigError, match="device"):
        Engine("test-seg", device="warp-drive")
    with pytest.raises(ConfigError, match="patch_size"):
        Engine("test-seg", patch_size=0)


DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_configuration_page_lists_every_field_with_its_flag():
    from geoserve.server.settings import ServerFields

    page = (DOCS / "configuration.md").read_text()
    for model in (EngineConfig, ServerFields):
        for name in model.model_fields:
            assert f"| `{name}` | `--{name.replace('_', '-')}`" in page, name


def test_the_example_files_are_valid_and_predict_runs_with_one(tmp_path):
    import rasterio

    from geoserve.cli import main
    from tests.conftest import LAKE

    serve_args = build_parser().parse_args(["serve", "--config", str(DOCS / "examples/serve.yaml")])
    assert server_settings(serve_args).max_wait_ms == 5
    out = tmp_path / "water.tif"
    argv = ["predict", "--config", str(DOCS / "examples/predict.yaml"), str(LAKE), "-o", str(out)]
    assert main([*argv, "-q"]) == 0
    with rasterio.open(out) as dst, rasterio.open(LAKE) as src:
        assert dst.dtypes[0] == "float32"  # output_kind: probabilities
        assert dst.profile["tiled"]  # cog: true
        assert (dst.crs, dst.transform, dst.shape) == (src.crs, src.transform, src.shape)


def test_predict_writes_to_output_dir_without_o_and_needs_one_of_them(tmp_path, make_geotiff):
    from geoserve.cli import main

    src = make_geotiff(bands=3)
    with pytest.raises(SystemExit) as info:
        main(["predict", str(src), "-m", "identity"])
    assert info.value.code == 2  # a usage error: neither -o nor an output directory
    out = tmp_path / "outs"
    assert main(["predict", str(src), "-m", "identity", "--output-dir", str(out), "-q"]) == 0
    assert (out / f"{src.stem}_pred.tif").is_file()


def test_paths_in_a_file_expand_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "conf" / "c.yaml"
    path.parent.mkdir()
    path.write_text("output_dir: ~/outs\nweights: w.pt\n")
    args = build_parser().parse_args(["predict", "a.tif", "--config", str(path)])
    config = engine_config(args, read_options(args.config, dict.fromkeys(FIELDS, EngineConfig)))
    assert config.output_dir == tmp_path / "outs"
    assert config.weights == path.parent / "w.pt"  # absolute: Ray actors get it as it is
    assert config.weights.is_absolute()


def test_json_duplicates_and_a_byte_order_mark(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"threads": 2, "threads": 3}')
    with pytest.raises(ConfigError, match="'threads' is given twice"):
        EngineConfig.from_file(path)
    path.write_bytes(b"\xef\xbb\xbf" + b'{"threads": 2}')
    assert EngineConfig.from_file(path).threads == 2


def test_an_empty_api_key_is_refused_not_a_silent_switch_off(monkeypatch):
    monkeypatch.setenv("GEOSERVE_API_KEY", "secret")
    with pytest.raises(ConfigError, match="--api-key: empty"):
        server_settings(build_parser().parse_args(["serve", "--api-key", ""]))
    assert server_settings(build_parser().parse_args(["serve"])).api_key == "secret"


def test_python_callers_get_config_errors_and_may_pass_a_mapping():
    from geoserve import Engine

    with pytest.raises(ConfigError, match="compile: should be a valid boolean"):
        EngineConfig.build(compile="eager")  # the backend is its own field
    engine = Engine("identity", {"max_batch_patches": 4})
    assert engine.max_batch_patches == 4
    with pytest.raises(ConfigError, match="device: 'cuda:7' requested, but this machine has"):
        Engine("identity", device="cuda:7")
    with pytest.raises(ConfigError, match="compile_backend: unknown 'nonexistent'"):
        Engine("identity", compile=True, compile_backend="nonexistent")


def test_a_hub_reference_is_kept_as_written_by_python_flags_and_files(tmp_path):
    ref = "hf://org/repo/w.safetensors@v1"
    assert EngineConfig(weights=ref).weights == ref
    args = build_parser().parse_args(["predict", "a.tif", "-o", "b.tif", "--weights", ref])
    assert engine_config(args, {}).weights == ref
    path = tmp_path / "c.yaml"
    path.write_text(f"weights: {ref}\n")  # not a path relative to the file
    args = build_parser().parse_args(["predict", "a.tif", "--config", str(path)])
    assert engine_config(args, read_options(args.config, dict.fromkeys(FIELDS, EngineConfig))) == (
        EngineConfig(weights=ref)
    )
    assert EngineConfig.from_file(path).weights == ref
    path.write_text("weights: s3://bucket/w.pt\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: weights: URL 's3://bucket/w\.pt'"):
        engine_config(args, read_options(args.config, dict.fromkeys(FIELDS, EngineConfig)))
    args = build_parser().parse_args(["predict", "a.tif", "-o", "b.tif", "--weights", "hf://x"])
    with pytest.raises(ConfigError, match=r"^--weights: Hub reference 'hf://x'"):
        engine_config(args, {})
