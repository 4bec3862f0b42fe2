"""TerraTorch fine-tune configs: what is read, what is refused, the processors they give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from geoserve.errors import WeightsError
from geoserve.models.encoder_decoder import build_network
from geoserve.models.families import encoder_decoder_processors
from geoserve.models.terratorch_config import is_encoder_decoder_config, read_fine_tune

ED_ARGS = {
    "backbone": "timm_resnet18",
    "backbone_in_chans": 4,
    "decoder": "UNetDecoder",
    "decoder_channels": [64, 32, 32, 16, 16],
    "num_classes": 3,
}
DATA = {
    "dataset_bands": ["COASTAL", "BLUE", "GREEN", "RED", "NIR", "SWIR"],
    "output_bands": ["BLUE", "GREEN", "RED", "NIR"],
    "means": [500.0, 600.0, 700.0, 2000.0],
    "stds": [300.0, 310.0, 320.0, 800.0],
    "constant_scale": 0.5,
}


def write(tmp_path: Path, model_args: dict[str, Any], data: Any = None, **init: Any) -> Path:
    init_args = {"model_factory": "EncoderDecoderFactory", "model_args": model_args, **init}
    raw: dict[str, Any] = {
        "model": {"class_path": "terratorch.tasks.SemanticSegmentationTask", "init_args": init_args}
    }
    if data is not None:
        raw["data"] = {"class_path": "GenericNonGeoSegmentationDataModule", "init_args": data}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_processors_come_from_the_data_section_and_the_tiling(tmp_path):
    tiling = {"crop": 128, "stride": 96, "delta": 8, "batch_size": 4}
    path = write(
        tmp_path,
        ED_ARGS,
        DATA,
        tiled_inference_parameters=tiling,
        class_names=["land", "water", "cloud"],
    )
    patcher, reassembler = encoder_decoder_processors(read_fine_tune(path))
    assert patcher.bands == (1, 2, 3, 4)  # the output bands' places in the dataset bands
    assert patcher.band_roles == ("BLUE", "GREEN", "RED", "NIR")
    assert patcher.mean == (500.0, 600.0, 700.0, 2000.0)
    assert patcher.std == (300.0, 310.0, 320.0, 800.0)
    assert patcher.scale_factor == 0.5
    assert (patcher.patch_size, patcher.stride, patcher.blend) == (128, 96, "cosine")
    assert reassembler.classes == ("land", "water", "cloud")


def test_predict_bands_ranges_and_the_defaults(tmp_path):
    data = {
        "dataset_bands": [[0, 5]],  # an inclusive range of indices
        "output_bands": [0, 1, 2, 3],
        "predict_dataset_bands": [[0, 12]],
        "predict_output_bands": [[3, 5], 9],
    }
    patcher, reassembler = encoder_decoder_processors(
        read_fine_tune(write(tmp_path, ED_ARGS, data))
    )
    assert patcher.bands == (3, 4, 5, 9)  # what prediction reads
    assert patcher.std is None
    assert patcher.scale_factor == 1.0
    assert patcher.mean == (0.0,) * 4  # no means: none subtracted, yet 4 bands required
    assert (patcher.patch_size, patcher.stride, patcher.blend) == (512, 448, "center")
    assert reassembler.classes == ("class 0", "class 1", "class 2")


def test_a_band_list_alone_is_the_file_s_bands_in_order(tmp_path):
    path = write(tmp_path, ED_ARGS, {"bands": ["B2", "B3", "B4", "B8"]})
    patcher, _ = encoder_decoder_processors(read_fine_tune(path))
    assert patcher.bands is None
    assert patcher.band_roles == ("B2", "B3", "B4", "B8")
    tiling = {"h_crop": 64, "w_crop": 64, "h_stride": 64, "w_stride": 64, "average_patches": False}
    path = write(tmp_path, ED_ARGS, None, tiled_inference_parameters=tiling)
    patcher, _ = encoder_decoder_processors(read_fine_tune(path))
    assert (patcher.patch_size, patcher.stride, patcher.blend) == (64, 64, "center")


def test_smp_config_takes_in_channels_from_the_bands(tmp_path):
    args = {"backbone": "resnet50", "model": "FPN", "bands": ["B", "G", "R"], "num_classes": 2}
    path = write(tmp_path, args)
    path.write_text(path.read_text().replace("EncoderDecoderFactory", "SMPModelFactory"))
    spec = read_fine_tune(path).network
    assert (spec.factory, spec.encoder, spec.decoder) == ("SMPModelFactory", "resnet50", "FPN")
    assert (spec.in_channels, spec.num_classes) == (3, 2)
    assert is_encoder_decoder_config(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"decoder": "ASPPSegmentationHead"}, "supported: UNetDecoder, UperNetDecoder, FPN"),
        ({"backbone": "timm_vit_base_patch16_224"}, "supported: timm backbones timm_resnet18"),
        ({"backbone_bands": ["RED"]}, "backbone_bands: is not supported for timm backbones"),
        ({"decoder_kernel": 3}, "supported: decoder_channels, decoder_use_batchnorm"),
        ({"head_layers": 2}, "supported: head_channel_list, head_dropout"),
        ({"num_classes": 10**9}, "num_classes: must be an integer from 1 to 1024"),
        ({"backbone_in_chans": "6"}, "backbone_in_chans: must be an integer from 1 to 8192"),
        ({"necks": [{"name": "LearnedInterpolateToPyramidal"}]}, "only one SelectIndices"),
        ({"peft_config": {"method": "LORA"}}, "peft_config: is not supported"),
        ({"num_classes": None}, "num_classes: is required"),
        ({"decoder_channels": None}, "decoder_channels: must be a list of integers"),
    ],
)
def test_what_is_refused_is_named_with_what_is_supported(tmp_path, change, message):
    path = write(tmp_path, {**ED_ARGS, **change})
    with pytest.raises(WeightsError, match="model_args") as info:
        read_fine_tune(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("init", "data", "message"),
    [
        ({"model_factory": "PrithviModelFactory"}, None, "SMPModelFactory, EncoderDecoderFactory"),
        ({"class_names": ["a", "b"]}, None, "class_names: must list 3 names"),
        ({"tiled_inference_parameters": {"h_crop": 64, "w_crop": 96}}, None, "square patches"),
        ({"tiled_inference_parameters": {"crop": 64, "stride": 96}}, None, "larger than the crop"),
        ({}, {"means": [1.0, 2.0], "stds": [1.0, 1.0]}, "means: has 2 values, but the model takes"),
        ({}, {"means": "stats/means.txt"}, "means: names a file"),
        ({}, {"output_bands": ["RED", "NIR", "B", "G", "X"]}, "selects 5 bands, but the model"),
        ({}, {"dataset_bands": ["A"], "output_bands": ["B", "C", "D", "E"]}, "names bands not in"),
        ({}, {"stds": [1.0, 0.0, 1.0, 1.0]}, "stds: must all be positive"),
    ],
)
def test_inconsistent_data_and_tiling_are_refused(tmp_path, init, data, message):
    path = write(tmp_path, ED_ARGS, data, **init)
    if "model_factory" in init:
        path.write_text(path.read_text().replace("EncoderDecoderFactory", init["model_factory"]))
    with pytest.raises(WeightsError, match=message.replace("(", r"\(")):
        read_fine_tune(path)


def test_only_segmentation_tasks(tmp_path):
    path = write(tmp_path, ED_ARGS)
    path.write_text(path.read_text().replace("SemanticSegmentation", "PixelwiseRegression"))
    with pytest.raises(WeightsError, match="SemanticSegmentationTask fine-tunes"):
        read_fine_tune(path)


def test_smp_arguments_are_checked_against_the_architecture(tmp_path):
    args = {"backbone": "resnet18", "model": "Unet", "bands": [0, 1, 2], "smp_kernels": 3}
    path = write(tmp_path, args)
    path.write_text(path.read_text().replace("EncoderDecoderFactory", "SMPModelFactory"))
    with pytest.raises(WeightsError, match="smp_kernels is not an argument of smp.Unet"):
        build_network(read_fine_tune(path).network)


def test_prithvi_configs_are_left_to_the_prithvi_loader(tmp_path):
    path = write(tmp_path, {"backbone": "prithvi_eo_v2_300_tl", "decoder": "UperNetDecoder"})
    assert not is_encoder_decoder_config(path)
    (tmp_path / "broken.yaml").write_text("model: [")
    assert not is_encoder_decoder_config(tmp_path / "broken.yaml")


@pytest.mark.parametrize(
    ("decoder_args", "message"),
    [
        (
            {"decoder": "UperNetDecoder", "decoder_pool_scales": [1, 10000]},
            "decoder_pool_scales[1]: must be an integer from 1 to 64",
        ),
        (
            {"decoder": "FPN", "decoder_decoder_merge_policy": "mul"},
            "'mul' is not supported; supported: add, cat",
        ),
        ({"decoder": "FPN", "head_dropout": 2}, "head_dropout: must be a number from 0 to 1"),
        ({"decoder": "FPN", "backbone_output_stride": 4}, "supported: 8, 16, 32"),
        ({"decoder": "UNetDecoder"}, "decoder_channels: is required for UNetDecoder"),
    ],
)
def test_sizes_without_weights_are_bounded_too(tmp_path, decoder_args, message):
    args = {"backbone": "resnet18", "num_classes": 2, **decoder_args}
    with pytest.raises(WeightsError) as info:
        read_fine_tune(write(tmp_path, args))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("model: &m {init_args: *m}\n", "nested over 64 levels", id="self-alias"),
        pytest.param(
            "a: &a [" + ",".join(["0"] * 1000) + "]\n"
            "b: &b [" + ",".join(["*a"] * 1000) + "]\n"
            "c: [" + ",".join(["*b"] * 1000) + "]\n",  # a billion values from 8 KB
            r"over 1,048,576 values \(YAML aliases expanded\)",
            id="alias-bomb",
        ),
    ],
)
def test_yaml_aliases_cannot_make_a_config_huge(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(WeightsError, match=message):
        read_fine_tune(path)
    assert not is_encoder_decoder_config(path)


@pytest.mark.parametrize("key", [1, None, 2.5])
def test_argument_keys_must_be_names(tmp_path, key):
    path = tmp_path / "config.yaml"
    raw = yaml.safe_load(write(tmp_path, ED_ARGS).read_text())
    raw["model"]["init_args"]["model_args"][key] = 3
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(WeightsError, match=rf"model_args: key '{key}' is not a name"):
        read_fine_tune(path)
