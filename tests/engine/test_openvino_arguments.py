"""``backend: openvino`` for a model that takes more than pixels: a Prithvi TL model's location.

A tiny Prithvi-EO-2.0-TL-shaped UperNet (random weights, 12 blocks of width 48) served as
``prithvi-eo2-300m-tl-sen1floods11``: its location (and date, when a scene has one) go into the
converted model as inputs of their own, live, not traced in as constants.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.windows import Window

pytest.importorskip("openvino")
pytest.importorskip("nncf")

from geoserve import Engine  # noqa: E402
from geoserve.engine.openvino_backend import OpenVinoRunner  # noqa: E402
from geoserve.models.prithvi import PrithviSegmentation, encoder_kwargs  # noqa: E402

LAKE = Path(__file__).parents[2] / "data" / "S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
MODEL = "prithvi-eo2-300m-tl-sen1floods11"
TILING = {"patch_size": 224, "stride": 192}  # (two patches a crop)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoint, and one lake crop at its place and the same pixels 2,000 km north."""
    root = tmp_path_factory.mktemp("ov_args")
    torch.manual_seed(0)
    kw = encoder_kwargs("prithvi_eo_v2_300_tl", num_frames=1, embed_dim=48, depth=12, num_heads=2)
    net = PrithviSegmentation(
        num_classes=2, feature_indices=(2, 5, 8, 11), decoder_channels=32, **kw
    ).eval()
    ckpt = root / "tiny.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}}, ckpt)
    out = {"weights": ckpt}
    with rasterio.open(LAKE) as src:
        window = Window(0, 0, 416, 224)
        data = src.read(window=window)
        transform = src.window_transform(window)
        profile = {**src.profile, "width": 416, "height": 224, "tiled": False}
        for name, north in (("here", 0.0), ("north", 2_000_000.0)):
            profile["transform"] = (
                transform * Affine.translation(0, 0)
                if not north
                else (Affine.translation(0, north) * transform)
            )
            with rasterio.open(root / f"{name}.tif", "w", **profile) as dst:
                dst.write(data)
                dst.descriptions = src.descriptions
            out[name] = root / f"{name}.tif"
    return out


def raw(engine: Engine, scene: Path) -> np.ndarray:
    return engine.generate_image(scene, out_format="tensor").outputs.tensor.numpy()


def test_the_location_is_a_live_input_of_the_converted_model(files, tmp_path: Path) -> None:
    opts = {"weights": files["weights"], "max_batch_patches": 2, "output_kind": ["raw"], **TILING}
    with Engine(MODEL, **opts) as torch_engine:
        want = {s: raw(torch_engine, files[s]) for s in ("here", "north")}
    assert np.abs(want["here"] - want["north"]).max() > 1e-4  # (the model does use it)
    with Engine(MODEL, backend="openvino", backend_cache_dir=tmp_path, **opts) as ov:
        got = {s: raw(ov, files[s]) for s in ("here", "north")}
        assert isinstance(ov.runner, OpenVinoRunner)
        (converted,) = ov.runner.runtime["converted"]
    assert converted["extra_inputs"] == {"location_coords": [2]}
    for scene in ("here", "north"):  # one converted model, each place's own answer
        np.testing.assert_allclose(got[scene], want[scene], atol=1e-4, err_msg=scene)


def test_int8_is_calibrated_with_each_patch_s_location(files, tmp_path: Path) -> None:
    opts = {"weights": files["weights"], "max_batch_patches": 2, "output_kind": ["raw"], **TILING}
    with Engine(MODEL, **opts) as torch_engine:
        want = raw(torch_engine, files["north"])
    with Engine(
        MODEL,
        backend="openvino",
        precision="int8",
        calibrate=[files["here"], files["north"]],
        force_precision=True,  # (int8 pays only with VNNI/AMX, which this test must not need)
        backend_cache_dir=tmp_path,
        **opts,
    ) as q:
        got = raw(q, files["north"])
        assert isinstance(q.runner, OpenVinoRunner)
        (converted,) = q.runner.runtime["converted"]
    gate = converted["gate"]
    assert gate["patches"] >= 4
    assert gate["agreement"] >= 0.99, gate
    assert (got.argmax(0) == want.argmax(0)).mean() >= 0.99


def test_a_multimodal_model_is_converted_with_each_modality_an_input(files, tmp_path) -> None:
    """TerraMind tiny + UNet (S2L1C and S1GRD, either optional), a lake crop as its S2L1C."""
    from bench.families import _lightning, _terramind

    torch.manual_seed(0)
    weights = _lightning(_terramind().eval(), tmp_path / "terramind.ckpt")
    opts = {"weights": weights, "max_batch_patches": 2, "output_kind": ["raw"]}
    scene = {"S2L1C": str(files["here"])}
    with Engine("terramind-v1-sen1floods11", **opts) as torch_engine:
        want = torch_engine.generate_image(scene, out_format="tensor").outputs.tensor.numpy()
    with Engine(
        "terramind-v1-sen1floods11", backend="openvino", backend_cache_dir=tmp_path, **opts
    ) as ov:
        got = ov.generate_image(scene, out_format="tensor").outputs.tensor.numpy()
        assert isinstance(ov.runner, OpenVinoRunner)
        shapes = [c["input_shape"] for c in ov.runner.runtime["converted"]]
    assert {"S2L1C": [13, 224, 224]} in shapes  # (the modalities this request gave)
    np.testing.assert_allclose(got, want, atol=1e-4)
