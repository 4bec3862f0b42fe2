"""What ran, as a result's STAC Item tells it: the model, its classes and its weights.

:func:`model_info` describes an :class:`~geoserve.Engine`'s model once (:class:`ModelInfo`):
its name, architecture (the module's class), tasks and framework, named as the STAC Machine
Learning Model extension names them; its classes with the colours of the class map's colour
table; and its weights (:func:`weights_info`): the file's name, never its folder, and its
sha256, computed once per file version; a Hub reference as it was given.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoserve.errors import WeightsError
from geoserve.models.hub import is_hub_reference, resolve_weights
from geoserve.stac_products import sha256_of


@dataclass(frozen=True)
class ClassInfo:
    """One class of a model's class map: its value, name and colour (RGB; None: none)."""

    value: int
    name: str
    color: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class WeightsInfo:
    """The weights a model ran with: the file's name (never its folder), sha256, reference.

    ``reference``: the Hub reference it was fetched by (None: a local file).
    """

    file: str
    sha256: str
    reference: str | None = None

    def to_json(self) -> dict[str, str]:
        """As the Item's ``geoserve:weights``."""
        out = {"file": self.file, "sha256": self.sha256}
        return {**out, "reference": self.reference} if self.reference else out


@dataclass(frozen=True)
class ModelInfo:
    """The model a result came from, as its Item tells (see :func:`model_info`)."""

    name: str
    architecture: str | None = None
    tasks: tuple[str, ...] = ()
    framework: str = "pytorch"
    framework_version: str | None = None
    classes: tuple[ClassInfo, ...] = ()
    weights: WeightsInfo | None = None

    def to_json(self) -> dict[str, Any]:
        """As the Item's ``geoserve:model`` (the MLM extension's names for these fields)."""
        out: dict[str, Any] = {"name": self.name, "framework": self.framework}
        if self.architecture:
            out["architecture"] = self.architecture
        if self.tasks:
            out["tasks"] = list(self.tasks)
        if self.framework_version:
            out["framework_version"] = self.framework_version
        return out


def model_info(engine: Any) -> ModelInfo:
    """What an :class:`~geoserve.Engine` runs: its model, classes, colours and weights.

    The weights' sha256 is computed once per file (cached by path, size and modification
    time), so calling this for every result costs nothing after the first.

    Raises:
        WeightsError: the weights file cannot be read.
    """
    import torch  # (an engine exists: torch is loaded)

    spec, out = engine.spec, engine.model_out_proc
    names = tuple(getattr(out, "classes", ()) or ())
    colors = tuple(getattr(out, "class_colors", ()) or ())
    table = len(names) < 255  # class maps past 254 classes are uint16, with no colour table
    classes = tuple(
        ClassInfo(i, n, colors[i] if table and i < len(colors) else None)
        for i, n in enumerate(names)
    )
    module = getattr(engine, "model", None)
    module = getattr(module, "_orig_mod", module)  # (torch.compile's wrapper: the model in it)
    return ModelInfo(
        name=spec.name,
        architecture=None if module is None else type(module).__name__,
        tasks=("semantic-segmentation",) if names else (),
        framework_version=torch.__version__,
        classes=classes,
        weights=weights_info(engine.config.weights, bundled=spec.bundled_weights),
    )


def weights_info(
    weights: str | os.PathLike[str] | None, *, bundled: Path | None = None
) -> WeightsInfo | None:
    """The weights setting as the Item tells it: a file's name and sha256, or a Hub reference.

    ``weights``: the engine's ``weights`` (a path, or an ``hf://`` reference: resolved again
    through the Hub's cache, which the engine filled, once per process); None: the model's
    ``bundled`` file, if it ships one.

    Raises:
        WeightsError: the file cannot be read; ConfigError: a malformed Hub reference.
    """
    if weights is None:
        return None if bundled is None else WeightsInfo(bundled.name, weights_sha256(bundled))
    if isinstance(weights, str) and is_hub_reference(weights):
        return _hub_weights(weights)
    path = Path(weights)
    return WeightsInfo(path.name, weights_sha256(path))


def weights_sha256(path: Path) -> str:
    """``path``'s sha256 (hex), computed once per file version (path, size, mtime).

    Raises:
        WeightsError: the file cannot be read (naming it).
    """
    try:
        st = path.stat()
        return _sha256(str(path.resolve()), st.st_size, st.st_mtime_ns)
    except OSError as exc:
        raise WeightsError(f"weights {path}: cannot be read ({exc.strerror or exc})") from None


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_of(Path(path))


@functools.lru_cache(maxsize=16)
def _hub_weights(reference: str) -> WeightsInfo:
    path = resolve_weights(reference)
    assert path is not None  # (a reference resolves to a file or raises)
    return WeightsInfo(path.name, weights_sha256(path), reference)
