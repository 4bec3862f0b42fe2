"""The reference implementation, loaded from TerraTorch's wheel on PyPI (never vendored).

TerraTorch's Prithvi, UperNet, neck and head modules import only torch, timm, einops, numpy and
torchvision (its UNet decoder also segmentation-models-pytorch 0.5.0, a dev dependency), plus
``terratorch.registry`` for decorators. The whole package pulls Lightning and
more, so instead its wheel is downloaded once (``pip download``) into ``.cache/`` and the needed
files are imported from it, with a stand-in for the registry decorators.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VERSION = "1.2.13"
CACHE = ROOT / ".cache" / f"terratorch-{VERSION}"


class _Registry:
    def register(self, obj=None, **_kw):
        return obj if obj is not None else (lambda o: o)

    def __getattr__(self, name):
        return lambda *a, **k: None


def _fetch() -> Path:
    src = CACHE / "src"
    if (src / "terratorch").is_dir():
        return src
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--dest",
            str(CACHE),
            f"terratorch=={VERSION}",
        ],
        check=True,
        timeout=300,
    )
    wheel = next(CACHE.glob("terratorch-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(src)
    return src


def load() -> types.SimpleNamespace:
    """Import the reference modules; returns them as attributes."""
    src = _fetch()
    pkg_root = src / "terratorch"
    for name, sub in (
        ("terratorch", ""),
        ("terratorch.models", "models"),
        ("terratorch.models.backbones", "models/backbones"),
        ("terratorch.models.decoders", "models/decoders"),
        ("terratorch.models.heads", "models/heads"),
    ):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [str(pkg_root / sub)]  # a package, without running its __init__
            sys.modules[name] = mod
    registry = types.ModuleType("terratorch.registry")
    for attr in (
        "TERRATORCH_DECODER_REGISTRY",
        "TERRATORCH_NECK_REGISTRY",
        "NECK_REGISTRY",
        "BACKBONE_REGISTRY",
        "TERRATORCH_BACKBONE_REGISTRY",
        "TERRATORCH_FULL_MODEL_REGISTRY",
    ):
        setattr(registry, attr, _Registry())
    sys.modules.setdefault("terratorch.registry", registry)
    return types.SimpleNamespace(
        mae=importlib.import_module("terratorch.models.backbones.prithvi_mae"),
        upernet=importlib.import_module("terratorch.models.decoders.upernet_decoder"),
        unet=importlib.import_module("terratorch.models.decoders.unet_decoder"),
        necks=importlib.import_module("terratorch.models.necks"),
        heads=importlib.import_module("terratorch.models.heads.segmentation_head"),
        utils=importlib.import_module("terratorch.models.utils"),
    )


def load_tiled_inference() -> types.ModuleType:
    """TerraTorch's ``terratorch.tasks.tiled_inference`` (imports torch, tqdm and its utils)."""
    load()
    src = _fetch()
    if "terratorch.tasks" not in sys.modules:
        mod = types.ModuleType("terratorch.tasks")
        mod.__path__ = [str(src / "terratorch" / "tasks")]
        sys.modules["terratorch.tasks"] = mod
    return importlib.import_module("terratorch.tasks.tiled_inference")
