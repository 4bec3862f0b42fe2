"""Checkpoint families: which family a checkpoint or a fine-tune config is, and building it.

The one place that decides TerraMind, TerraTorch encoder-decoder or Prithvi, for both ways of
naming a model: :func:`load_checkpoint` (a checkpoint, with a config file given or one beside
it) and :func:`serve_config` (a fine-tune config alone, its checkpoint perhaps given only when
the model is loaded: :mod:`geoserve.models.configured` registers what it returns).

A config file decides first (:func:`config_family`: the first row of :data:`FAMILIES` that
``names`` it); else the checkpoint's tensor names (the first row that ``holds`` them): Prithvi,
the last, takes everything else, as ``load_checkpoint`` did before there were others. A new
family is one more :class:`Family` row before it. (A Prithvi ``config.yaml`` beside a TerraMind
checkpoint does not make it Prithvi's, as a ``config.json`` beside it never did.)

Nothing here imports torch until a model is described or built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geoserve.errors import ConfigError
from geoserve.models.config_file import read_mapping

if TYPE_CHECKING:
    from torch import nn

    from geoserve.models.terratorch_config import FineTune
    from geoserve.processors import GeoTiffPatcher, InputProcessor, SegmentationReassembler

ConfigArg = Mapping[str, Any] | str | os.PathLike[str] | None


@dataclass(frozen=True)
class Served:
    """A model a fine-tune config describes, ready to register.

    Attributes:
        input: Its input processor (the config's data section and tiling).
        output: Its output processor (a class map of the config's classes).
        description: The network, in a few words.
        load: ``load(checkpoint)``: the model, loaded strictly.
        token_size: Its encoder's patch tokens, for the embeddings kinds (None: none).
    """

    input: InputProcessor
    output: SegmentationReassembler
    description: str
    load: Callable[[Path], nn.Module]
    token_size: int | None = None


@dataclass(frozen=True)
class Family:
    """One kind of checkpoint.

    Attributes:
        name: For messages.
        names: ``names(config, config_file)``: whether a parsed config file names this family.
        holds: ``holds(keys)``: whether a checkpoint's tensor names are this family's (asked
            only where no config names a family).
        load: ``load(checkpoint, variant, config)``: the model, loaded strictly.
        serve: ``serve(config_file)``: the model its fine-tune config describes (None: this
            family is not served from a config alone).
    """

    name: str
    names: Callable[[Mapping[str, Any], Path], bool]
    holds: Callable[[list[str]], bool]
    load: Callable[[Path, str | None, ConfigArg], nn.Module]
    serve: Callable[[Path], Served] | None = None


def _names_terramind(config: Mapping[str, Any], config_file: Path) -> bool:
    from geoserve.models.terramind.config import is_terramind_config

    return is_terramind_config(config)


def _holds_terramind(keys: list[str]) -> bool:
    from geoserve.models.terramind.checkpoint import is_terramind_state

    return is_terramind_state(keys)


def _load_terramind(checkpoint: Path, variant: str | None, config: ConfigArg) -> nn.Module:
    from geoserve.models.terramind import load_terramind

    if variant is not None or isinstance(config, Mapping):
        raise ConfigError(
            f"{checkpoint}: a TerraMind checkpoint takes its architecture from its weights and "
            "a TerraTorch config file, not from variant= or a mapping"
        )
    return load_terramind(checkpoint, config)


def _serve_terramind(config_file: Path) -> Served:
    from geoserve.models.terramind.configured import terramind_processors

    in_proc, out_proc, describe = terramind_processors(config_file)
    return Served(
        in_proc,
        out_proc,
        describe,
        lambda checkpoint: _load_terramind(checkpoint, None, config_file),
        token_size=16,
    )


def _names_encoder_decoder(config: Mapping[str, Any], config_file: Path) -> bool:
    from geoserve.models.terratorch_config import is_encoder_decoder_config

    return is_encoder_decoder_config(config_file)


def _load_encoder_decoder(checkpoint: Path, variant: str | None, config: ConfigArg) -> nn.Module:
    from geoserve.models.encoder_decoder import load_fine_tune

    if variant is not None:
        raise ConfigError(
            f"variant={variant!r} names a Prithvi encoder; a TerraTorch SMP / timm "
            "encoder-decoder is described by its config file alone"
        )
    cfg = _config_file(checkpoint, config)
    assert cfg is not None  # named only by one
    return load_fine_tune(checkpoint, cfg)


def _serve_encoder_decoder(config_file: Path) -> Served:
    from geoserve.models.terratorch_config import read_fine_tune

    fine_tune = read_fine_tune(config_file)  # read once: each load builds from it

    def load(checkpoint: Path) -> nn.Module:
        from geoserve.models.encoder_decoder import load_fine_tune

        return load_fine_tune(checkpoint, fine_tune)

    in_proc, out_proc = encoder_decoder_processors(fine_tune)
    return Served(in_proc, out_proc, fine_tune.network.describe(), load)


def encoder_decoder_processors(
    fine_tune: FineTune,
) -> tuple[GeoTiffPatcher, SegmentationReassembler]:
    """The input and output processors an encoder-decoder fine-tune's config describes."""
    from geoserve.processors import GeoTiffPatcher, SegmentationReassembler

    data, n = fine_tune.data, fine_tune.network.in_channels
    names = data.band_names if data.band_names and len(data.band_names) == n else None
    patcher = GeoTiffPatcher(
        bands=data.bands,
        # without means the band count is still the model's (zeros change no value)
        mean=data.means if data.means is not None else (0.0,) * n,
        std=data.stds,
        scale_factor=data.scale,
        patch_size=data.patch_size,
        stride=data.stride,
        blend=data.blend,
        band_roles=names,
    )
    return patcher, SegmentationReassembler(classes=data.class_names)


def _load_prithvi(checkpoint: Path, variant: str | None, config: ConfigArg) -> nn.Module:
    from geoserve.models.prithvi import load_checkpoint as load_prithvi

    return load_prithvi(checkpoint, variant=variant, config=config)


TERRAMIND = Family(
    "TerraMind", _names_terramind, _holds_terramind, _load_terramind, _serve_terramind
)
ENCODER_DECODER = Family(
    "TerraTorch SMP / timm encoder-decoder",
    _names_encoder_decoder,
    lambda keys: False,
    _load_encoder_decoder,
    _serve_encoder_decoder,
)
PRITHVI = Family("Prithvi", lambda config, config_file: False, lambda keys: True, _load_prithvi)
FAMILIES: tuple[Family, ...] = (TERRAMIND, ENCODER_DECODER, PRITHVI)


def config_family(config_file: Path) -> Family | None:
    """The family a config file names; None for one that names none (a Prithvi config).

    Raises:
        WeightsError: the file is missing, unreadable, or not a mapping.
    """
    config = read_mapping(config_file)
    return next((f for f in FAMILIES if f.names(config, config_file)), None)


def checkpoint_family(checkpoint: Path, config_file: Path | None) -> Family:
    """The family of a checkpoint: the one its config file names, else the one its keys show.

    Raises:
        WeightsError: the config or the checkpoint cannot be read.
    """
    family = config_family(config_file) if config_file is not None else None
    if family is None:
        from geoserve.models.state_dict import checkpoint_keys

        keys = checkpoint_keys(checkpoint)
        family = next(f for f in FAMILIES if f.holds(keys))
    return family


def load_checkpoint(
    path: str | Path, *, variant: str | None = None, config: ConfigArg = None
) -> nn.Module:
    """The model a local checkpoint holds, built by its family's loader (see :data:`FAMILIES`).

    Raises:
        ConfigError: ``config`` is of the wrong type, or does not suit the family.
        WeightsError: unreadable checkpoint or config, or one that does not match the model.
    """
    path = Path(path)
    return checkpoint_family(path, _config_file(path, config)).load(path, variant, config)


def serve_config(config_file: Path) -> Served:
    """The model a fine-tune config describes: a TerraMind one, else an encoder-decoder.

    A config naming neither (a Prithvi fine-tune, another task) is read as an encoder-decoder's,
    whose reader's error says what geoserve serves.

    Raises:
        WeightsError: the config cannot be read, lacks what serving needs, or describes a
            network geoserve does not build.
    """
    family = config_family(config_file)
    serve = family.serve if family is not None else None
    return (serve or _serve_encoder_decoder)(config_file)


def _config_file(checkpoint: Path, config: ConfigArg) -> Path | None:
    """The config file given, else a ``config.yaml`` beside the checkpoint, else None."""
    if isinstance(config, str | os.PathLike):
        return Path(config)
    if config is None and (checkpoint.parent / "config.yaml").is_file():
        return checkpoint.parent / "config.yaml"
    return None
