"""TerraTorch fine-tunes served without code: ``--config-file``, ``--register``, models dirs.

One small fine-tune (timm ResNet-18 + UNetDecoder over 4 of a file's 6 bands, built by
TerraTorch's own factory with random weights) is saved as a Lightning checkpoint beside its
config, and run through the command line and the server.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio
import torch
import yaml
from rasterio.io import MemoryFile

from geoserve.cli import build_parser, main
from geoserve.cli.configured import chosen_model
from geoserve.cli.serve import server_settings
from geoserve.errors import ConfigError
from geoserve.models.configured import models_in_dir, unregister_configured
from geoserve.registry import MODEL_REGISTRY
from tests.conftest import write_geotiff
from tests.models.terratorch_reference import load

DATASET_BANDS = ["COASTAL", "BLUE", "GREEN", "RED", "NIR", "SWIR"]
OUTPUT_BANDS = ["BLUE", "GREEN", "RED", "NIR"]
MEANS = [500.0, 600.0, 700.0, 2000.0]
STDS = [300.0, 310.0, 320.0, 800.0]
SCALE = 0.5
MODEL_ARGS = {
    "backbone": "timm_resnet18",
    "backbone_in_chans": 4,
    "backbone_pretrained": False,
    "decoder": "UNetDecoder",
    "decoder_channels": [32, 32, 16, 16, 16],
    "num_classes": 3,
}


def write_fine_tune(
    model_dir: Path, ckpt_name: str = "epoch=3.ckpt"
) -> tuple[Path, Path, torch.nn.Module]:
    """(config.yaml, checkpoint, reference model): the fine-tune written into ``model_dir``."""
    torch.manual_seed(3)
    reference = load().build("EncoderDecoderFactory", **MODEL_ARGS)
    model_dir.mkdir(parents=True, exist_ok=True)
    ckpt = model_dir / ckpt_name
    torch.save({"state_dict": {f"model.{k}": v for k, v in reference.state_dict().items()}}, ckpt)
    config = {
        "model": {
            "class_path": "terratorch.tasks.SemanticSegmentationTask",
            "init_args": {
                "model_factory": "EncoderDecoderFactory",
                "model_args": MODEL_ARGS,
                "class_names": ["unburned", "burned", "cloud"],
                "tiled_inference_parameters": {"crop": 64, "stride": 64, "average_patches": False},
            },
        },
        "data": {
            "class_path": "GenericNonGeoSegmentationDataModule",
            "init_args": {
                "dataset_bands": DATASET_BANDS,
                "output_bands": OUTPUT_BANDS,
                "means": MEANS,
                "stds": STDS,
                "constant_scale": SCALE,
            },
        },
    }
    cfg = model_dir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    return cfg, ckpt, reference


def write_scene(path: Path) -> Path:
    """A 64 x 64 scene of the fine-tune's six dataset bands."""
    data = np.random.default_rng(5).integers(0, 6000, (6, 64, 64)).astype(np.uint16)
    return write_geotiff(path, data)


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory):
    """(config, checkpoint, reference model, scene): one model of its own directory."""
    root = tmp_path_factory.mktemp("fine_tune")
    cfg, ckpt, reference = write_fine_tune(root / "models" / "burns")
    return cfg, ckpt, reference, write_scene(root / "scene.tif")


@pytest.fixture(autouse=True)
def forget_registered():
    before = set(MODEL_REGISTRY.names())
    yield
    for name in set(MODEL_REGISTRY.names()) - before:
        unregister_configured(name)


def expected_classes(reference: torch.nn.Module, scene: Path) -> np.ndarray:
    """The reference's class map of the whole 64x64 scene, normalised as TerraTorch does."""
    with rasterio.open(scene) as src:
        raw = src.read().astype(np.float32)
    picked = raw[[DATASET_BANDS.index(b) for b in OUTPUT_BANDS]] * SCALE
    x = (picked - np.array(MEANS)[:, None, None]) / np.array(STDS)[:, None, None]
    with torch.inference_mode():
        logits = reference(torch.from_numpy(x.astype(np.float32))[None]).output
    return logits.argmax(1)[0].numpy()


def test_predict_with_config_file_and_weights(fine_tune, tmp_path):
    cfg, ckpt, reference, scene = fine_tune
    out = tmp_path / "burns.tif"
    argv = ["predict", str(scene), "-o", str(out), "--config-file", str(cfg), "--weights"]
    assert main([*argv, str(ckpt), "-q"]) == 0
    with rasterio.open(out) as dst, rasterio.open(scene) as src:
        assert (dst.crs, dst.transform, dst.shape) == (src.crs, src.transform, src.shape)
        assert (dst.count, dst.dtypes[0]) == (1, "uint8")
        assert dst.tags()["CLASS_NAMES"] == "unburned,burned,cloud"
        classes = dst.read(1)
    np.testing.assert_array_equal(classes, expected_classes(reference, scene))


def test_predict_without_weights_says_which_checkpoint(fine_tune, tmp_path, capsys):
    cfg, _, _, scene = fine_tune
    argv = ["predict", str(scene), "-o", str(tmp_path / "o.tif"), "--config-file", str(cfg)]
    assert main([*argv, "--model", "burns-adhoc"]) == 1
    err = capsys.readouterr().err
    assert "model 'burns-adhoc' needs a weights file (--weights FILE" in err
    assert f"the checkpoint of the fine-tune {cfg} describes" in err


def test_a_config_yaml_without_model_or_weights_is_named_after_its_directory(
    fine_tune, tmp_path, capsys
):
    cfg, _, _, scene = fine_tune  # (models/burns/config.yaml)
    argv = ["predict", str(scene), "-o", str(tmp_path / "o.tif"), "--config-file", str(cfg)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "model 'burns' needs a weights file (--weights FILE" in err  # not 'config'
    assert f"the checkpoint of the fine-tune {cfg} describes" in err


def test_models_lists_a_registered_fine_tune(fine_tune, capsys):
    cfg, ckpt, _, _ = fine_tune
    assert main(["models", "--json", "--register", f"burn-ft={cfg},{ckpt}"]) == 0
    entry = next(e for e in json.loads(capsys.readouterr().out) if e["name"] == "burn-ft")
    assert (entry["plugin"], entry["weights"]) == ("configured", "registered")
    assert entry["bands"] == [1, 2, 3, 4]
    assert entry["classes"] == ["unburned", "burned", "cloud"]
    assert "timm_resnet18 + UNetDecoder (EncoderDecoderFactory)" in entry["description"]


def test_predict_with_register_and_models_dir(fine_tune, tmp_path):
    cfg, ckpt, reference, scene = fine_tune
    out = tmp_path / "a.tif"
    argv = ["predict", str(scene), "-o", str(out), "-q"]
    assert main([*argv, "--register", f"burn-ft={cfg},{ckpt}", "--model", "burn-ft"]) == 0
    assert main([*argv, "--models-dir", str(cfg.parents[1])]) == 0  # its one model: burns
    with rasterio.open(out) as dst:
        np.testing.assert_array_equal(dst.read(1), expected_classes(reference, scene))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--register", "burn-ft"], "expected NAME=CONFIG.yaml,WEIGHTS.ckpt"),
        (["--register", "bad name=c.yaml"], "invalid model name 'bad name'"),
        (["--config-file", "missing.yaml"], "missing.yaml: config file not found"),
        (["--models-dir", "nowhere"], "nowhere: models directory not found"),
    ],
)
def test_bad_registrations_exit_1_naming_the_file(tmp_path, capsys, flags, message):
    scene = write_geotiff(tmp_path / "s.tif", np.zeros((4, 8, 8), np.uint16))
    assert main(["predict", str(scene), "-o", str(tmp_path / "o.tif"), *flags]) == 1
    assert message in capsys.readouterr().err


def test_a_name_taken_is_an_error(fine_tune, capsys):
    cfg, ckpt, _, _ = fine_tune
    assert main(["models", "--register", f"identity={cfg},{ckpt}"]) == 1
    assert "model 'identity' is already registered" in capsys.readouterr().err


def test_models_dir_needs_one_checkpoint_per_model(fine_tune, tmp_path):
    cfg, _, _, _ = fine_tune
    (tmp_path / "floods").mkdir()
    (tmp_path / "floods" / "config.yaml").write_text(cfg.read_text())
    with pytest.raises(ConfigError, match=r"floods: needs exactly one checkpoint .* found none"):
        models_in_dir(tmp_path)
    (tmp_path / "floods" / "decoy.ckpt").mkdir()  # a directory is no checkpoint
    with pytest.raises(ConfigError, match=r"floods: needs exactly one checkpoint .* found none"):
        models_in_dir(tmp_path)
    (tmp_path / "floods" / "BEST.CKPT").write_bytes(b"")  # suffixes in any case
    assert [m.weights.name for m in models_in_dir(tmp_path)] == ["BEST.CKPT"]
    (tmp_path / "floods" / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="floods: no config.yaml or config.yml"):
        models_in_dir(tmp_path)


def test_serve_models_dir_registers_and_serves(fine_tune):
    from tests.server.conftest import running_server

    cfg, _, reference, scene = fine_tune
    models = cfg.parents[1]
    settings = server_settings(build_parser().parse_args(["serve", "--models-dir", str(models)]))
    assert (settings.model, settings.models_dir) == ("burns", models)  # the one model there
    with running_server(model="burns", models_dir=models) as url:
        listed = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert listed["id"] == "burns"
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", scene.read_bytes())})
    assert resp.status_code == 200, resp.text
    with MemoryFile(resp.content) as mem, mem.open() as ds:
        np.testing.assert_array_equal(ds.read(1), expected_classes(reference, scene))


def test_one_model_registered_twice_is_the_one_model():
    """--register NAME=... beside a models dir holding NAME (same files): no choice to make."""
    assert chosen_model(None, ["tm1", "tm1"], "default") == "tm1"
    with pytest.raises(ConfigError, match=r"2 models registered \(a, b\)"):
        chosen_model(None, ["a", "b", "a"], "default")
