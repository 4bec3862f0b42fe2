import pytest
import torch
from safetensors.torch import save_file

from geoserve import Engine
from geoserve.errors import WeightsError
from geoserve.models.state_dict import load_weights
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
    with pytest.raises(WeightsError, match=r"junk\.pt: cannot read weights") as e:
        Engine("test-seg", weights=junk)
    assert "\n" not in str(e.value)


def test_weights_of_other_shapes_are_named(tmp_path):
    path = tmp_path / "wide.pt"
    state = TinySeg().state_dict()
    state["conv.weight"] = torch.zeros(4, 5, 3, 3)  # a model for 5 bands, not 3
    torch.save(state, path)
    with pytest.raises(WeightsError, match=r"wide\.pt: weights do not match model 'test-seg'") as e:
        Engine("test-seg", weights=path)
    assert "shape mismatch at conv.weight: checkpoint (4, 5, 3, 3), model (4, 3, 3, 3)" in str(
        e.value
    )
    assert "\n" not in str(e.value)


def test_pickled_module_and_non_mappings_are_refused(tmp_path):
    whole = tmp_path / "module.pt"
    torch.save(TinySeg(), whole)
    with pytest.raises(WeightsError, match=r"module\.pt: holds a pickled tests\.stub_models") as e:
        Engine("test-seg", weights=whole)
    assert "state_dict()" in str(e.value)
    assert "\n" not in str(e.value)
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(WeightsError, match=r"list\.pt: not a state dict \(got list\)"):
        Engine("test-seg", weights=listed)
