"""Fine-tunes of one encoder hold it once: parts with equal weights shared between models.

Three TerraTorch fine-tunes (timm ResNet-18 + UNet decoder) with one encoder's weights and
three heads of their own, as fine-tunes with a frozen backbone are, loaded side by side.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from bench.shared_weights import LOAD
from geoserve import Engine
from geoserve.engine.shared_weights import share_identical
from geoserve.models.configured import register_configured, unregister_configured
from geoserve.registry import MODEL_REGISTRY
from tests.test_cli_configured import write_fine_tune, write_scene

NAMES = ("shared-floods", "shared-burns", "shared-crops")  # (names no other test registers)


def write_fine_tunes(root: Path) -> Path:
    """A models directory of three fine-tunes: one encoder, each its own decoder and head."""
    cfg, ckpt, _ = write_fine_tune(root / NAMES[0], "best.ckpt")
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    for seed, name in enumerate(NAMES[1:], 1):
        g = torch.Generator().manual_seed(seed)
        own = {
            k: v * (1 + 0.05 * torch.randn(v.shape, generator=g))
            if v.is_floating_point() and not k.startswith("model.encoder.")
            else v
            for k, v in state.items()
        }
        (root / name).mkdir()
        shutil.copy(cfg, root / name / "config.yaml")
        torch.save({"state_dict": own}, root / name / "best.ckpt")
    return root


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    return write_fine_tunes(root / "models"), write_scene(root / "scene.tif")


@pytest.fixture
def registered(models_dir):
    models, _ = models_dir
    before = set(MODEL_REGISTRY.names())
    for name in NAMES:
        register_configured(name, models / name / "config.yaml", models / name / "best.ckpt")
    yield
    for name in set(MODEL_REGISTRY.names()) - before:
        unregister_configured(name)


def classes(engine: Engine, scene: Path) -> np.ndarray:
    return engine.generate_image(scene, out_format="tensor").outputs.tensor.numpy()


def test_fine_tunes_of_one_encoder_hold_it_once_and_answer_as_alone(models_dir, registered):
    _, scene = models_dir
    engines = [Engine(name) for name in NAMES]
    first = engines[0].model.encoder
    for eng in engines[1:]:
        assert eng.model.encoder is first
        assert [p.path for p in eng.shared_parts][:1] == ["encoder"]
        assert eng.model.decoder is not engines[0].model.decoder  # (each keeps its own)
        assert sum(p.bytes for p in eng.shared_parts) >= 40 * 2**20  # ResNet-18: 42.7 MiB
    got = [classes(eng, scene) for eng in engines]
    alone = [classes(Engine(name, share_weights=False), scene) for name in NAMES]
    for a, b in zip(got, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(got[0], got[1])  # (the heads differ, so do the maps)


def test_a_shared_encoder_outlives_the_model_that_loaded_it(models_dir, registered):
    _, scene = models_dir
    want = classes(Engine(NAMES[1], share_weights=False), scene)
    floods, burns = Engine(NAMES[0]), Engine(NAMES[1])
    assert burns.model.encoder is floods.model.encoder
    del floods
    gc.collect()
    np.testing.assert_array_equal(classes(burns, scene), want)
    assert Engine(NAMES[2]).model.encoder is burns.model.encoder


def test_share_weights_off_keeps_a_copy(models_dir, registered):
    floods = Engine(NAMES[0])
    burns = Engine(NAMES[1], share_weights=False)
    assert burns.model.encoder is not floods.model.encoder
    assert burns.shared_parts == ()


class Encoder(torch.nn.Module):
    """Equal weights, and a setting that changes what it returns."""

    def __init__(self, out_indices: tuple[int, ...], seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(2))
        self.out_indices = out_indices


class Net(torch.nn.Module):
    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(128, 2)


def test_only_equal_weights_and_equal_settings_are_shared():
    base = Net(Encoder((0, 1)))
    share_identical(base)
    same = Net(Encoder((0, 1)))
    other_setting = Net(Encoder((1,)))
    other_weights = Net(Encoder((0, 1), seed=1))
    assert [p.path for p in share_identical(same)] == ["encoder"]
    assert same.encoder is base.encoder
    # (its blocks have base's weights: they are shared, the module with another setting not)
    assert [p.path for p in share_identical(other_setting)] == ["encoder.blocks"]
    assert other_setting.encoder is not base.encoder
    assert other_setting.encoder.out_indices == (1,)
    assert share_identical(other_weights) == []


def test_a_module_holding_what_cannot_be_compared_is_not_shared_whole():
    def encoder_with(state: object) -> Net:
        net = Net(Encoder((0, 1), seed=7))
        net.encoder.state = state  # type: ignore[assignment]
        return net

    a = encoder_with(lambda x: x)
    share_identical(a)
    b = encoder_with(lambda x: x)
    assert [p.path for p in share_identical(b)] == ["encoder.blocks"]  # (not the encoder)
    assert b.encoder.blocks is a.encoder.blocks


def test_three_fine_tunes_of_one_encoder_take_about_one_encoders_memory(models_dir):
    """Resident memory of three fine-tunes loaded side by side, sharing and not (RSS)."""
    models, _ = models_dir

    def grown(share: str) -> float:
        cmd = [sys.executable, "-c", LOAD, str(models), share, *NAMES]  # (bench's own)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        return float(json.loads(done.stdout.strip().splitlines()[-1])["grown_mb"])

    shared, separate = grown("on"), grown("off")
    encoder_mb = 42.7  # ResNet-18's weights, float32 (MiB)
    assert separate - shared > 0.7 * 2 * encoder_mb, (shared, separate)


def test_a_server_of_three_fine_tunes_says_what_they_share(models_dir, request):
    from tests.server.conftest import running_server

    for name in NAMES:  # (the server registers them in this process: forget them after)
        request.addfinalizer(lambda name=name: unregister_configured(name))

    models, scene = models_dir
    with running_server(model=NAMES[0], models=list(NAMES), models_dir=models) as url:
        listed = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
        answers = [
            httpx.post(
                f"{url}/v1/images",
                files={"file": ("s.tif", scene.read_bytes())},
                data={"model": name},
                timeout=60,
            )
            for name in NAMES
        ]
    for name in NAMES[1:]:
        shared = listed[name]["runtime"]["shared_weights"]
        assert shared["parts"][0] == "encoder"
        assert shared["mb"] > 40
    for resp in answers:
        assert resp.status_code == 200, resp.text


def test_tensors_that_cannot_be_read_are_never_shared():
    with torch.device("meta"):
        a, b = Net(Encoder((0, 1))), Net(Encoder((0, 1)))
    share_identical(a)
    assert share_identical(b) == []  # (no error, and nothing matched)


def test_resident_bytes_counts_a_shared_or_tied_tensor_once() -> None:
    from geoserve.engine.shared_weights import resident_bytes

    encoder = torch.nn.Linear(256, 256)  # 256 * 256 + 256 floats
    a = torch.nn.Sequential(encoder, torch.nn.Linear(256, 2))
    b = torch.nn.Sequential(encoder, torch.nn.Linear(256, 3))
    enc = (256 * 256 + 256) * 4
    assert resident_bytes([a]) == enc + (256 * 2 + 2) * 4
    assert resident_bytes([a, b]) == enc + (256 * 2 + 2) * 4 + (256 * 3 + 3) * 4
    tied = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))
    tied[1].weight = tied[0].weight
    assert resident_bytes([tied]) == 8 * 8 * 4
    assert resident_bytes([]) == 0
