import pytest
import torch
from safetensors.torch import save_file

from geoserve import Engine
from geoserve.engine import load_weights
from geoserve.errors import WeightsError
from tests.stub_models import TinySeg


@pytest.mark.parametrize("suffix", [".pt", ".safetensors", ".ckpt"])
def test_weights_load_from_local_file(tmp_path, suffix):
    model = TinySeg()
    with torch.no_grad():
        model.conv.bias.fill_(7.0)
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        save_file(model.state_dict(), str(path))
    elif suffix == ".ckpt":
        torch.save({"state_dict": model.state_dict(), "epoch": 3}, path)
    else:
        torch.save(model.state_dict(), path)
    engine = Engine("test-seg", weights=path)
    assert torch.equal(engine.model.conv.bias, torch.full((4,), 7.0))


def test_mismatched_keys_are_named(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"conv.weight": torch.zeros(4, 3, 3, 3), "head.extra": torch.zeros(1)}, path)
    with pytest.raises(WeightsError, match=r"missing \['conv.bias'\].*unexpected \['head.extra'\]"):
        load_weights(TinySeg(), path, "test-seg")


def test_missing_and_unreadable_weights(tmp_path):
    with pytest.raises(WeightsError, match=r"nope\.pt: weights file for model 'test-seg'"):
        Engine("test-seg", weights=tmp_path / "nope.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"garbage")
    with pytest.raises(WeightsError, match=r"junk\.pt: cannot read weights"):
        Engine("test-seg", weights=junk)
