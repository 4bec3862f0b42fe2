"""TerraTorch's model factories, imported from its wheel (as ``prithvi/reference.py`` does).

The parity tests of the timm / SMP encoder-decoders build their reference with TerraTorch
1.2.13's own ``SMPModelFactory`` and ``EncoderDecoderFactory``: the factories, their registries
(``terratorch/registry/registry.py``, ``timm_registry.py``, ``smp_registry.py``), the decoders,
heads and ``PixelWiseModel`` are the wheel's files, unchanged. Only what the whole package would
pull in besides is left out:

- ``terratorch/__init__.py`` and the ``models``, ``backbones``, ``decoders``, ``registry``
  package ``__init__`` files are not run (they import every backbone, Lightning, mmseg and the
  custom-module loader); the registry package gets the names its ``__init__`` would export;
- ``terratorch.datasets`` (rasterio, scikit-learn, ...) is a stand-in module holding only
  ``HLSBands``, whose class body is compiled from the wheel's ``datasets/utils.py``.

The decoders are registered in the real decoder registry here, by the wheel's own decorator,
whichever harness imported their modules first.
"""

from __future__ import annotations

import ast
import enum
import importlib
import sys
import types
import typing
from pathlib import Path

from tests.models.prithvi.reference import VERSION, _fetch

__all__ = ["VERSION", "load"]

_PACKAGES = (
    ("terratorch", ""),
    ("terratorch.models", "models"),
    ("terratorch.models.backbones", "models/backbones"),
    ("terratorch.models.decoders", "models/decoders"),
    ("terratorch.models.heads", "models/heads"),
)
_REGISTRY_NAMES = (
    "MultiSourceRegistry",
    "Registry",
    "BACKBONE_REGISTRY",
    "DECODER_REGISTRY",
    "NECK_REGISTRY",
    "FULL_MODEL_REGISTRY",
    "TERRATORCH_BACKBONE_REGISTRY",
    "TERRATORCH_DECODER_REGISTRY",
    "TERRATORCH_NECK_REGISTRY",
    "TERRATORCH_FULL_MODEL_REGISTRY",
    "MODEL_FACTORY_REGISTRY",
)


def _package(name: str, path: Path) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]  # a package, without running its __init__
        sys.modules[name] = mod
    return mod


def _datasets(src: Path) -> None:
    """``terratorch.datasets`` holding ``HLSBands`` only, compiled from the wheel's source."""
    if "terratorch.datasets" in sys.modules:
        return
    tree = ast.parse((src / "terratorch" / "datasets" / "utils.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HLSBands")
    mod = types.ModuleType("terratorch.datasets")
    namespace = mod.__dict__
    namespace.update(Enum=enum.Enum, Any=typing.Any)
    exec(compile(ast.Module(body=[cls], type_ignores=[]), "datasets/utils.py", "exec"), namespace)
    sys.modules["terratorch.datasets"] = mod


def _registry(src: Path) -> types.ModuleType:
    """The real registries, as the ``terratorch.registry`` package exports them."""
    current = sys.modules.get("terratorch.registry")
    if current is not None and hasattr(current, "_geoserve_real"):
        return current
    pkg = types.ModuleType("terratorch.registry")
    pkg.__path__ = [str(src / "terratorch" / "registry")]
    stub = sys.modules.pop("terratorch.registry", None)  # prithvi/reference.py's stand-in
    sys.modules["terratorch.registry"] = pkg
    real = importlib.import_module("terratorch.registry.registry")
    for name in _REGISTRY_NAMES:
        setattr(pkg, name, getattr(real, name))
    pkg._geoserve_real = True
    if stub is not None:  # modules imported under the stand-in: point them at the real ones
        for mod_name, mod in list(sys.modules.items()):
            if mod_name.startswith("terratorch.") and mod is not pkg:
                for name in _REGISTRY_NAMES:
                    if type(getattr(mod, name, None)).__name__ == "_Registry":  # the stand-in's
                        setattr(mod, name, getattr(real, name))
    importlib.import_module("terratorch.registry.timm_registry")
    importlib.import_module("terratorch.registry.smp_registry")
    return pkg


def load() -> types.SimpleNamespace:
    """The reference factories; ``build(factory, **model_args)`` builds a model in eval mode."""
    src = _fetch()
    for name, sub in _PACKAGES:
        _package(name, src / "terratorch" / sub)
    _datasets(src)
    registry = _registry(src)
    heads = sys.modules["terratorch.models.heads"]
    for attr, module in (
        ("SegmentationHead", "segmentation_head"),
        ("RegressionHead", "regression_head"),
        ("ScalarHead", "scalar_head"),
    ):
        if not hasattr(heads, attr):
            sub = importlib.import_module(f"terratorch.models.heads.{module}")
            setattr(heads, attr, getattr(sub, attr))
    decoders = {}
    for module, cls in (
        ("unet_decoder", "UNetDecoder"),
        ("upernet_decoder", "UperNetDecoder"),
        ("fcn_decoder", "FCNDecoder"),
    ):
        decoder = getattr(importlib.import_module(f"terratorch.models.decoders.{module}"), cls)
        if cls not in registry.TERRATORCH_DECODER_REGISTRY:
            registry.TERRATORCH_DECODER_REGISTRY.register(decoder)
        decoders[cls] = decoder
    smp_factory = importlib.import_module("terratorch.models.smp_model_factory")
    ed_factory = importlib.import_module("terratorch.models.encoder_decoder_factory")
    factories = {
        "SMPModelFactory": smp_factory.SMPModelFactory(),
        "EncoderDecoderFactory": ed_factory.EncoderDecoderFactory(),
    }

    def build(factory: str, **model_args: typing.Any) -> typing.Any:
        return factories[factory].build_model(task="segmentation", **model_args).eval()

    return types.SimpleNamespace(build=build, decoders=decoders, registry=registry)
