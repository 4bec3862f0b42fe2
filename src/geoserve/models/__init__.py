"""Models shipped with geoserve (registered through the ``geoserve.plugins`` entry point)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (importing geoserve.models alone does not import torch)
    from torch import nn


def load_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> nn.Module:
    """Build and load the model of a local checkpoint.

    Prithvi checkpoints, and TerraTorch SMP / timm encoder-decoders described by their
    fine-tune config. See :func:`geoserve.models.families.load_checkpoint` (which family
    loads what) and :func:`geoserve.models.prithvi.load_checkpoint`; imported lazily so that
    plain ``import geoserve`` does not import timm.
    """
    from geoserve.models.families import load_checkpoint as load

    return load(path, variant=variant, config=config)
