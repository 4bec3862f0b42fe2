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

from geoserve.errors import ConfigError


def load_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> nn.Module:
    """Build and load the model a local checkpoint holds: Prithvi or TerraMind.

    The family is recognised from the config (a TerraTorch config whose backbone is
    ``terramind_*``, named or beside the checkpoint) or from the keys (TerraMind's per-modality
    ``encoder_embeddings``); anything else is Prithvi. See
    :func:`geoserve.models.prithvi.load_checkpoint` and
    :func:`geoserve.models.terramind.load_terramind`. Imported lazily so that plain
    ``import geoserve`` does not import timm.
    """
    if _is_terramind(Path(path), config):
        from geoserve.models.terramind import load_terramind

        if variant is not None or isinstance(config, Mapping):
            raise ConfigError(
                f"{path}: a TerraMind checkpoint takes its architecture from a config file, "
                "not from variant= or a mapping"
            )
        return load_terramind(path, config)
    from geoserve.models.prithvi import load_checkpoint as load

    return load(path, variant=variant, config=config)


def _is_terramind(path: Path, config: object) -> bool:
    from geoserve.models.prithvi.config import read_mapping
    from geoserve.models.terramind.checkpoint import find_config, is_terramind_state
    from geoserve.models.terramind.config import is_terramind_config

    if isinstance(config, str | os.PathLike):
        return is_terramind_config(read_mapping(Path(config)))
    if config is None and find_config(path) is not None:
        return True
    return is_terramind_state(checkpoint_keys(path))


def checkpoint_keys(path: str | Path) -> list[str]:
    """The tensor names in a checkpoint, read without loading the tensors where possible.

    Raises:
        WeightsError: the file is missing or unreadable.
    """
    import torch

    from geoserve.errors import WeightsError

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: checkpoint not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                return list(f.keys())
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise WeightsError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {exc})") from exc
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    return [str(k) for k in raw] if isinstance(raw, Mapping) else []
