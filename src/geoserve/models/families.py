"""Checkpoint families: which loader builds the model a checkpoint and its config describe.

:data:`FAMILIES` is tried in order; the first whose ``claims`` accepts the checkpoint and its
config file (the one given, else a ``config.yaml`` beside the checkpoint) loads it. Prithvi,
the last, takes everything else, as ``load_checkpoint`` did before there were others. A new
family is one more :class:`Family` row before it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

ConfigArg = Mapping[str, Any] | str | os.PathLike[str] | None


@dataclass(frozen=True)
class Family:
    """One kind of checkpoint.

    Attributes:
        name: For messages.
        claims: ``claims(checkpoint, config_file)``: whether this family loads it
            (``config_file``: the config given as a path, else one beside the checkpoint, else
            None).
        load: ``load(checkpoint, variant, config)``: the model, loaded strictly.
    """

    name: str
    claims: Callable[[Path, Path | None], bool]
    load: Callable[[Path, str | None, ConfigArg], nn.Module]


def _is_encoder_decoder(checkpoint: Path, config_file: Path | None) -> bool:
    from geoserve.models.terratorch_config import is_encoder_decoder_config

    return config_file is not None and is_encoder_decoder_config(config_file)


def _load_encoder_decoder(checkpoint: Path, variant: str | None, config: ConfigArg) -> nn.Module:
    from geoserve.errors import ConfigError
    from geoserve.models.encoder_decoder import load_fine_tune

    if variant is not None:
        raise ConfigError(
            f"variant={variant!r} names a Prithvi encoder; a TerraTorch SMP / timm "
            "encoder-decoder is described by its config file alone"
        )
    cfg = _config_file(checkpoint, config)
    assert cfg is not None  # claimed only with one
    return load_fine_tune(checkpoint, cfg)


def _is_terramind(checkpoint: Path, config_file: Path | None) -> bool:
    """A TerraMind config; else, unless the config is an encoder-decoder's, TerraMind's keys.

    (A Prithvi ``config.yaml`` beside a TerraMind checkpoint does not make it Prithvi's, as a
    ``config.json`` beside it never did.)
    """
    from geoserve.models.config_file import read_mapping
    from geoserve.models.state_dict import checkpoint_keys
    from geoserve.models.terramind.checkpoint import is_terramind_state
    from geoserve.models.terramind.config import is_terramind_config
    from geoserve.models.terratorch_config import is_encoder_decoder_config

    if config_file is not None:
        if is_terramind_config(read_mapping(config_file)):
            return True
        if is_encoder_decoder_config(config_file):
            return False
    return is_terramind_state(checkpoint_keys(checkpoint))


def _load_terramind(checkpoint: Path, variant: str | None, config: ConfigArg) -> nn.Module:
    from geoserve.errors import ConfigError
    from geoserve.models.terramind import load_terramind

    if variant is not None or isinstance(config, Mapping):
        raise ConfigError(
            f"{checkpoint}: a TerraMind checkpoint takes its architecture from its weights and "
            "a TerraTorch config file, not from variant= or a mapping"
        )
    return load_terramind(checkpoint, config)


def _load_prithvi(checkpoint: Path, variant: str | None, config: ConfigArg) -> nn.Module:
    from geoserve.models.prithvi import load_checkpoint

    return load_checkpoint(checkpoint, variant=variant, config=config)


FAMILIES: tuple[Family, ...] = (
    Family("TerraMind", _is_terramind, _load_terramind),
    Family("TerraTorch SMP / timm encoder-decoder", _is_encoder_decoder, _load_encoder_decoder),
    Family("Prithvi", lambda checkpoint, config_file: True, _load_prithvi),
)


def _config_file(checkpoint: Path, config: ConfigArg) -> Path | None:
    if isinstance(config, str | os.PathLike):
        return Path(config)
    if config is None and (checkpoint.parent / "config.yaml").is_file():
        return checkpoint.parent / "config.yaml"
    return None


def load_checkpoint(
    path: str | Path, *, variant: str | None = None, config: ConfigArg = None
) -> nn.Module:
    """The model a local checkpoint holds, built by its family's loader (see :data:`FAMILIES`).

    Raises:
        ConfigError: ``config`` is of the wrong type, or does not suit the family.
        WeightsError: unreadable checkpoint or config, or one that does not match the model.
    """
    path = Path(path)
    config_file = _config_file(path, config)
    family = next(f for f in FAMILIES if f.claims(path, config_file))
    return family.load(path, variant, config)
