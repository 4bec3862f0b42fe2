"""Models configured on the command line: ``--config-file``, ``--register``, ``--models-dir``.

A TerraTorch fine-tune is served without code: ``predict --config-file FINETUNE.yaml --weights
model.ckpt`` registers it for this run (under ``--model NAME``, else the config file's name),
``--register NAME=CONFIG.yaml,WEIGHTS.ckpt`` (repeatable) registers named ones, and a models
directory registers one per sub-directory (see :mod:`geoserve.models.configured`). When these
register models and no ``--model`` is given, the one model registered is used (several: an
error listing them).

Registration imports torch; the flags themselves do not.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from geoserve.errors import ConfigError
from geoserve.models.configured import (
    CONFIG_NAMES,
    Configured,
    models_in_dir,
    parse_registration,
    register_all,
)


def add_configured_flags(
    parser: argparse.ArgumentParser, *, config_file: bool = False, models_dir: bool = True
) -> None:
    """The flags, in a group of their own (``serve`` has ``--models-dir`` from its settings)."""
    group = parser.add_argument_group(
        "TerraTorch fine-tunes, served without code (see docs/models.md)"
    )
    if config_file:
        group.add_argument(
            "--config-file",
            metavar="FINETUNE.yaml",
            help="run the fine-tune this TerraTorch config describes (SMPModelFactory, or "
            "EncoderDecoderFactory with a timm backbone), its checkpoint given by --weights; "
            "named --model NAME, else after the file (burns.yaml: burns; burns/config.yaml: "
            "burns, as --models-dir names it)",
        )
    group.add_argument(
        "--register",
        action="append",
        metavar="NAME=CONFIG,WEIGHTS",
        help="register a fine-tune under NAME from its config and checkpoint (repeatable)",
    )
    if models_dir:
        group.add_argument(
            "--models-dir",
            metavar="DIR",
            help="register every fine-tune of DIR: DIR/NAME/config.yaml and one checkpoint "
            "(.ckpt, .pt, .pth, .safetensors) beside it",
        )


def planned_models(
    args: argparse.Namespace, *, models_dir: Path | str | None = None, model: str | None = None
) -> list[Configured]:
    """The models the flags name, in the order given; nothing is read or registered yet.

    ``models_dir``: a models directory from elsewhere (``serve``'s settings); ``model``: the
    name ``--config-file`` registers under (default: the file's name).

    Raises:
        ConfigError: a malformed ``--register``, a missing models directory or an incomplete
            model in it.
    """
    wanted: list[Configured] = []
    config_file = getattr(args, "config_file", None)
    if config_file is not None:
        wanted.append(Configured(model or _name_of(config_file), Path(config_file)))
    wanted += [parse_registration(text) for text in getattr(args, "register", None) or ()]
    directory = models_dir if models_dir is not None else getattr(args, "models_dir", None)
    if directory is not None:
        wanted += models_in_dir(directory)
    return wanted


def register_configured_models(
    args: argparse.Namespace, *, models_dir: Path | str | None = None, model: str | None = None
) -> list[str]:
    """Register the models the flags name (:func:`planned_models`); their names.

    Raises:
        ConfigError: as :func:`planned_models`, or an invalid name or a missing file.
        RegistryError: a name already taken.
        WeightsError: a config that cannot be read or describes an unsupported network.
    """
    return register_all(planned_models(args, models_dir=models_dir, model=model))


def chosen_model(given: str | None, registered: list[str], default: str) -> str:
    """``--model`` when given; else the one model just registered; else ``default``.

    Raises:
        ConfigError: several models were registered and none was chosen.
    """
    if given:
        return given
    registered = list(dict.fromkeys(registered))  # one model named twice is one model
    if len(registered) > 1:
        raise ConfigError(
            f"{len(registered)} models registered ({', '.join(registered)}); choose one with "
            "--model NAME"
        )
    return registered[0] if registered else default


def _name_of(config_file: str) -> str:
    """A model name from a config file's name: ``burn_scars.yaml`` -> ``burn_scars``.

    A file named as a models directory names it (``burns/config.yaml`` -> ``burns``, as
    ``--models-dir`` would), not ``config``.
    """
    path = Path(config_file).absolute()
    name = path.parent.name if path.name.lower() in CONFIG_NAMES else path.stem
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "fine-tune"
    return stem[:64]
