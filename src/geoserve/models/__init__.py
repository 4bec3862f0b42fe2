"""Models shipped with geoserve (registered through the ``geoserve.plugins`` entry point).

Importing the package imports no torch (:mod:`geoserve.models.hub` is read by the
configuration, which the command line checks before torch loads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn


def load_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> nn.Module:
    """Build and load a Prithvi model from a local checkpoint.

    See :func:`geoserve.models.prithvi.load_checkpoint`; imported lazily so that plain
    ``import geoserve`` does not import timm.
    """
    from geoserve.models.prithvi import load_checkpoint as load

    return load(path, variant=variant, config=config)
