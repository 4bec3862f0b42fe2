import pytest

from geoserve import load_plugins
from geoserve.errors import RegistryError, UnknownModelError, UnknownNameError
from geoserve.registry import MODEL_REGISTRY, Registry


def test_register_get_names_contains():
    reg: Registry[int] = Registry("thing")
    assert reg.register("b")(2) == 2
    reg.add("a", 1)
    assert reg.get("a") == 1
    assert reg.names() == ["a", "b"]
    assert "a" in reg
    assert "z" not in reg
    assert reg.items() == [("a", 1), ("b", 2)]
    assert len(reg) == 2


def test_duplicate_name_is_an_error_unless_override():
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(RegistryError, match="'a' is already registered"):
        reg.add("a", 2)
    reg.add("a", 3, override=True)
    assert reg.get("a") == 3


def test_empty_name_rejected():
    reg: Registry[int] = Registry("thing")
    with pytest.raises(RegistryError, match="non-empty"):
        reg.add("  ", 1)


def test_unknown_name_lists_known_and_close_matches():
    reg: Registry[int] = Registry("thing")
    reg.add("water", 1)
    reg.add("burn", 2)
    with pytest.raises(UnknownNameError) as info:
        reg.get("watr")
    msg = str(info.value)
    assert "unknown thing 'watr'" in msg
    assert "did you mean 'water'" in msg
    assert "known: burn, water" in msg
    assert isinstance(info.value, KeyError)


def test_model_registry_raises_unknown_model_error():
    load_plugins()
    with pytest.raises(UnknownModelError, match="known: .*identity"):
        MODEL_REGISTRY.get("no-such-model")


def test_unknown_name_errors_survive_pickling():
    import pickle

    err = UnknownModelError("nope", ["a", "b"])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UnknownModelError
    assert str(back) == str(err)
    assert back.known == ["a", "b"]
