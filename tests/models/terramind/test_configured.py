"""A TerraMind fine-tune served from its TerraTorch config: --config-file, --register, models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
import yaml

from geoserve.errors import WeightsError
from geoserve.models.terramind.configured import terramind_processors
from geoserve.models.terramind.variants import MODALITIES
from geoserve.processors import GeoTiffPatcher, MultimodalPatcher
from tests.models.terramind.test_plugin import (
    NECKS,
    save_lightning,
    tiny_finetune,
    write_s2_l1c,
)
from tests.multimodal_scenes import s2_transform, write_s1

SIX = ["BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"]


def write_config(path: Path, modalities: list[str], data: dict, **extra: object) -> Path:
    model_args = {
        "backbone": "terramind_v1_tiny",
        "backbone_pretrained": True,
        "backbone_modalities": modalities,
        "backbone_bands": {"S2L1C": SIX},
        "necks": NECKS,
        "decoder": "UNetDecoder",
        "decoder_channels": [64, 32, 16, 8],
        "num_classes": 2,
        **extra,
    }
    cfg = {
        "model": {
            "class_path": "terratorch.tasks.SemanticSegmentationTask",
            "init_args": {
                "model_factory": "EncoderDecoderFactory",
                "model_args": model_args,
                "class_names": ["dry", "wet"],
                "tiled_inference_parameters": {"crop": 128, "stride": 96},
            },
        },
        "data": {
            "class_path": "terratorch.datamodules.GenericMultiModalDataModule",
            "init_args": data,
        },
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


DATA = {
    "modalities": ["S2L1C", "S1GRD"],
    "dataset_bands": {"S2L1C": list(MODALITIES["S2L1C"].bands)},
    "means": {"S1GRD": [-10.0, -17.0]},
    "stds": {"S1GRD": [4.0, 5.0]},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tm_configured")
    write_s2_l1c(root / "s2.tif")
    write_s1(root / "s1.tif", 224)
    model = tiny_finetune({"S2L1C": 6, "S1GRD": 2})
    return {
        "root": root,
        "config": write_config(root / "config.yaml", ["S2L1C", "S1GRD"], DATA),
        "weights": save_lightning(model, root / "tm.ckpt"),
    }


def test_processors_come_from_the_data_section(files) -> None:
    patcher, out, describe = terramind_processors(files["config"])
    assert isinstance(patcher, MultimodalPatcher)
    s2, s1 = patcher.modalities
    info = MODALITIES["S2L1C"]
    assert s2.bands == (1, 2, 3, 8, 11, 12)  # backbone_bands' positions in dataset_bands
    assert s2.mean == tuple(info.mean[i] for i in (1, 2, 3, 8, 11, 12))  # published stats
    assert s1.mean == (-10.0, -17.0)
    assert s1.std == (4.0, 5.0)
    assert not s2.required
    assert not s1.required
    assert (patcher.patch_size, patcher.stride) == (128, 96)
    assert out.classes == ("dry", "wet")
    assert "terramind_v1_tiny" in describe


def test_reordered_backbone_bands_are_read_in_that_order(tmp_path: Path) -> None:
    """Without dataset_bands the file holds the modality's bands in their usual order."""
    order = list(reversed(MODALITIES["S2L1C"].bands))
    cfg = write_config(tmp_path / "c.yaml", ["S2L1C"], {}, backbone_bands={"S2L1C": order})
    patcher, _, _ = terramind_processors(cfg)
    assert patcher.bands == tuple(range(12, -1, -1))
    assert patcher.mean == tuple(reversed(MODALITIES["S2L1C"].mean))


def test_one_modality_is_a_single_file_model(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", ["S2L1C"], {"constant_scale": 0.5})
    patcher, _, _ = terramind_processors(cfg)
    assert isinstance(patcher, GeoTiffPatcher)
    assert patcher.bands == (1, 2, 3, 8, 11, 12)
    assert patcher.scale_factor == 0.5


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"means": [1.0, 2.0]}, "means: must map each modality"),
        ({"means": {"S1GRD": [1.0]}}, r"means\.S1GRD: has 1 values for 2 bands"),
        ({"stds": {"S1GRD": [1.0, 0.0]}}, r"stds\.S1GRD: must all be positive"),
        ({"dataset_bands": {"S2L1C": ["BLUE"]}}, r"dataset_bands\.S2L1C: lacks bands"),
    ],
)
def test_bad_data_sections_name_the_key(tmp_path: Path, data: dict, message: str) -> None:
    cfg = write_config(tmp_path / "c.yaml", ["S2L1C", "S1GRD"], data)
    with pytest.raises(WeightsError, match=message):
        terramind_processors(cfg)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "geoserve", *args], capture_output=True, text=True, timeout=600
    )


def test_predict_with_config_file_and_models_listing(files, tmp_path: Path) -> None:
    out = tmp_path / "wet.tif"
    root = files["root"]
    res = cli(
        "predict", "-i", f"S2L1C={root / 's2.tif'}", "-i", f"S1GRD={root / 's1.tif'}",
        "-o", str(out), "--config-file", str(files["config"]), "--weights", str(files["weights"]),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    with rasterio.open(out) as dst:
        assert dst.transform == s2_transform()
        values = dst.read(1)
    assert set(np.unique(values)) <= {0, 1}
    listed = cli(
        "models", "--json", "--register", f"wet={files['config']},{files['weights']}"
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    entry = next(m for m in json.loads(listed.stdout) if m["name"] == "wet")
    assert entry["plugin"] == "configured"
    assert "S2L1C" in json.dumps(entry)
