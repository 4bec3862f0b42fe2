"""Checkpoint files read as tensors, and strict loading that names what does not match.

Shared by every checkpoint family (Prithvi, TerraTorch encoder-decoders): a checkpoint is read
with ``torch.load(weights_only=True)`` (or safetensors), unwrapped from Lightning's or mmcv's
``state_dict``, and only its tensors are kept. :func:`load_strict` loads a model strictly and,
when keys or shapes differ, raises one error listing the missing and unexpected keys and the
first shape mismatch.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from geoserve.errors import WeightsError

#: Keys named in an error message, at most, per kind.
SHOWN_KEYS = 8


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file, unwrapped from ``state_dict`` if needed.

    Raises:
        WeightsError: missing, truncated or unreadable file.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: checkpoint not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            raw: Any = load_file(str(path))
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WeightsError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {exc})") from exc
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    if not isinstance(raw, Mapping):
        raise WeightsError(f"{path}: not a state dict (got {type(raw).__name__})")
    return {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}


def checkpoint_keys(path: str | Path) -> list[str]:
    """The tensor names in a checkpoint, read without loading its tensors where possible.

    A safetensors file's header, or ``torch.load`` memory-mapped (read whole for a file in
    torch's legacy, non-zip format, which cannot be memory-mapped).

    Raises:
        WeightsError: the file is missing or unreadable.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: checkpoint not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                return list(f.keys())
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as exc:
        raise WeightsError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {exc})") from exc
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    return [str(k) for k in raw] if isinstance(raw, Mapping) else []


def load_strict(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    path: str | Path,
    *,
    assign: bool = False,
) -> None:
    """Load ``state`` into ``model`` strictly.

    ``assign``: the checkpoint's tensors become the model's (cast to the model's dtypes), for
    a model built on the meta device.

    Raises:
        WeightsError: keys are missing or unexpected, or shapes differ; the message names the
            file, the missing keys (in the model's order), the unexpected ones and the first
            shape mismatch.
    """
    own = model.state_dict()
    check_matches(own, state, path)
    if assign:
        state = {k: v.to(own[k].dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=assign)


def check_matches(
    own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], path: str | Path
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
        raise WeightsError(f"{path}: checkpoint does not match the model: " + "; ".join(detail))


def _some(keys: list[str]) -> str:
    return f"{keys[:SHOWN_KEYS]}{' ...' if len(keys) > SHOWN_KEYS else ''}"
