"""Checkpoint files read as tensors, and strict loading that names what does not match.

The one home for reading a weights file, whoever asks: the engine loading a plugin model's
``--weights`` (:func:`load_weights`) and every checkpoint family (Prithvi, TerraMind, the
TerraTorch encoder-decoders), which read the file (:func:`read_state_dict`), rename its keys
and load it strictly (:func:`load_strict`). A file is read with ``torch.load(weights_only=True)``
(or safetensors), unwrapped from Lightning's or mmcv's ``state_dict``, and only its tensors are
kept; a pickled object is refused with one line saying so. Strict loading raises one error
listing the missing and unexpected keys and the first shape mismatch. Every message names the
file (and the model, where the caller knows it) on one line.

A Hub reference is no file: :mod:`geoserve.models.hub` turns it into a verified one first.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geoserve.errors import WeightsError

#: Keys named in an error message, at most, per kind.
SHOWN_KEYS = 8


def load_weights(module: nn.Module, path: str | Path, model_name: str | None = None) -> None:
    """Load a weights file into ``module`` strictly, its keys taken as they are.

    Raises:
        WeightsError: see :func:`read_state_dict` and :func:`load_strict`.
    """
    state = read_state_dict(path, model_name=model_name)
    load_strict(module, state, path, model_name=model_name)


def read_state_dict(path: str | Path, *, model_name: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors``, ``.pt``, ``.pth`` or ``.ckpt`` file.

    ``model_name``: the model they are for, named in the messages.

    Raises:
        WeightsError: a missing, truncated or unreadable file, one holding pickled objects,
            or one that is no state dict.
    """
    path = Path(path)
    _check_exists(path, model_name)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            raw: Any = load_file(str(path))
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise _read_error(path, exc) from exc
    raw = _unwrapped(raw)
    if not isinstance(raw, Mapping):
        raise WeightsError(f"{path}: not a state dict (got {type(raw).__name__})")
    return {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}


def checkpoint_keys(path: str | Path) -> list[str]:
    """The tensor names in a checkpoint, read without loading its tensors where possible.

    A safetensors file's header, or ``torch.load`` memory-mapped (read whole for a file in
    torch's legacy, non-zip format, which cannot be memory-mapped).

    Raises:
        WeightsError: as :func:`read_state_dict`, but for a file that is no state dict (it
            has no keys).
    """
    path = Path(path)
    _check_exists(path, None)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                return list(f.keys())
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as exc:
        raise _read_error(path, exc) from exc
    raw = _unwrapped(raw)
    return [str(k) for k in raw] if isinstance(raw, Mapping) else []


def load_strict(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    path: str | Path,
    *,
    assign: bool = False,
    model_name: str | None = None,
) -> None:
    """Load ``state`` into ``model`` strictly.

    ``assign``: the checkpoint's tensors become the model's (cast to the model's dtypes), for
    a model built on the meta device. ``model_name``: named in the message.

    Raises:
        WeightsError: keys are missing or unexpected, or shapes differ; the message names the
            file, the missing keys (in the model's order), the unexpected ones and the first
            shape mismatch.
    """
    own = model.state_dict()
    check_matches(own, state, path, model_name=model_name)
    if assign:
        state = {k: v.to(own[k].dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=assign)


def check_matches(
    own: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    path: str | Path,
    *,
    model_name: str | None = None,
) -> None:
    """Raise :func:`load_strict`'s error if ``state`` does not fit the state dict ``own``.

    Only names and shapes are compared, so ``own`` may be a model's on the meta device (built
    to check a checkpoint before any memory is spent on it).

    Raises:
        WeightsError: keys are missing or unexpected, or shapes differ (see :func:`load_strict`).
    """
    missing = [k for k in own if k not in state]
    unexpected = sorted(set(state) - set(own))
    wrong = [k for k in own if k in state and own[k].shape != state[k].shape]
    if missing or unexpected or wrong:
        detail = []
        if missing:
            detail.append(f"missing {_some(missing)}")
        if unexpected:
            detail.append(f"unexpected {_some(unexpected)}")
        if wrong:
            k = wrong[0]
            detail.append(
                f"shape mismatch at {k}: checkpoint {tuple(state[k].shape)}, "
                f"model {tuple(own[k].shape)} ({len(wrong)} keys differ)"
            )
        whose = f"model {model_name!r}" if model_name is not None else "the model"
        raise WeightsError(f"{path}: weights do not match {whose}: " + "; ".join(detail))


def _check_exists(path: Path, model_name: str | None) -> None:
    if not path.is_file():
        whose = f" for model {model_name!r}" if model_name is not None else ""
        raise WeightsError(f"{path}: weights file{whose} not found")


def _unwrapped(raw: Any) -> Any:
    """A Lightning or mmcv checkpoint's ``state_dict``; anything else as it is."""
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        return raw["state_dict"]
    return raw


def _read_error(path: Path, exc: Exception) -> WeightsError:
    """One line for a file torch or safetensors could not read (torch's run to a page)."""
    text = str(exc)
    unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if unsafe:
        return WeightsError(
            f"{path}: holds a pickled {unsafe.group(1)}, not only tensors (refused: weights are "
            "loaded with torch.load(weights_only=True)); save model.state_dict() instead"
        )
    detail = text.split("WeightsUnpickler error:", 1)[-1].strip() or type(exc).__name__
    return WeightsError(f"{path}: cannot read weights ({detail.splitlines()[0]})")


def _some(keys: list[str]) -> str:
    return f"{keys[:SHOWN_KEYS]}{' ...' if len(keys) > SHOWN_KEYS else ''}"
