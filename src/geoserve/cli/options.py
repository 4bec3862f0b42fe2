"""Command-line flags generated from pydantic models, and ``--config FILE``.

Every field of :class:`~geoserve.config.EngineConfig` (and of the server's own settings) becomes
a flag: ``max_batch_patches`` -> ``--max-batch-patches``; booleans get ``--x`` / ``--no-x``;
``Literal`` types give the choices; the field's docstring is the help text. Flags default to
"not given", so a value comes, in order of precedence, from the flag, the ``--config`` file,
then the field's default.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from geoserve.config import EngineConfig, config_error, read_config_file
from geoserve.errors import ConfigError
from geoserve.models.hub import scheme_of

#: Hand-written spellings kept beside the generated flag (older names, short forms).
ALIASES: dict[str, tuple[str, ...]] = {
    "max_batch_patches": ("--batch-size",),
    "request_timeout_s": ("--request-timeout",),
    "shutdown_timeout_s": ("--shutdown-timeout",),
    "allowed_input_dirs": ("--allowed-input-dir",),
    "allowed_url_domains": ("--allowed-url-domain",),
    "allowed_hosts": ("--allowed-host",),
}


def flag(name: str) -> str:
    """The flag a field is set with: ``max_batch_patches`` -> ``--max-batch-patches``."""
    return "--" + name.replace("_", "-")


def add_model_flags(
    parser: argparse.ArgumentParser | Any,
    model: type[BaseModel],
    *,
    skip: Iterable[str] = (),
) -> None:
    """One flag per field of ``model`` (but ``skip``), on ``parser`` or an argument group."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flags = [flag(name), *ALIASES.get(name, ())]
        kind, choices, item = _kind(field.annotation)
        extra = ""
        if kind == "list":
            extra = "repeatable" if item is Path else "comma-separated, or repeated"
        help_text = _help(field, extra)
        if kind == "bool":
            parser.add_argument(
                *flags,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        elif kind == "choices":
            parser.add_argument(
                *flags, dest=name, choices=choices, default=argparse.SUPPRESS, help=help_text
            )
        elif kind == "list":
            parser.add_argument(
                *flags,
                dest=name,
                action="extend",
                type=_list_parser(model, name, item),
                default=argparse.SUPPRESS,
                metavar="A,B" if item is not Path else "PATH",
                help=help_text,
            )
        else:
            parser.add_argument(
                *flags,
                dest=name,
                type=_scalar_parser(field),
                default=argparse.SUPPRESS,
                metavar=_metavar(name, field),
                help=help_text,
            )


def given(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``model`` set by a flag on this command line."""
    return {name: getattr(args, name) for name in model.model_fields if hasattr(args, name)}


def read_options(path: str | None, known: Mapping[str, type[BaseModel] | None]) -> dict[str, Any]:
    """``--config FILE``'s values, every key checked against ``known`` (key -> its model).

    Relative paths in the file are taken relative to the file's directory, so a
    configuration can be moved with what it names.

    Raises:
        ConfigError: the file cannot be read or parsed, or names an unknown option.
    """
    if path is None:
        return {}
    values = read_config_file(path)
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ConfigError(
            f"{path}: unknown option(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
        )
    base = Path(path).parent.absolute()
    for key, value in values.items():
        model = known[key]
        if model is None:
            if key == "model" and not (isinstance(value, str) and value.strip()):
                raise ConfigError(f"{path}: model: should be a model name (got {value!r})")
            continue
        if value is None:
            continue
        _, _, item = _kind(model.model_fields[key].annotation)
        if item is Path and isinstance(value, list):
            values[key] = [_file_path(base, v, path, key) for v in value]
        elif _is_path(model.model_fields[key].annotation) and isinstance(value, str):
            values[key] = _file_path(base, value, path, key)
    return values


def _file_path(base: Path, value: Any, source: str, key: str) -> Path | str:
    """A path written in a configuration file: ``~`` expanded, relative to the file.

    Text with a scheme (``hf://...``) is no path: it stays as written, for the field to check.
    """
    text = str(value).strip()
    if not text:
        raise ConfigError(f"{source}: {key}: an empty path")
    if scheme_of(text) is not None:
        return text
    return base / Path(text).expanduser()


def engine_config(args: argparse.Namespace, file_values: Mapping[str, Any]) -> EngineConfig:
    """The engine's configuration: flags over the ``--config`` file over the defaults.

    Raises:
        ConfigError: naming the file and key, or the flag, at fault.
    """
    from_file = {k: v for k, v in file_values.items() if k in EngineConfig.model_fields}
    base = EngineConfig.checked(from_file, source=str(getattr(args, "config", "") or ""))
    flags = given(args, EngineConfig)
    try:
        return EngineConfig.model_validate({**base.model_dump(exclude_unset=True), **flags})
    except ValidationError as exc:
        raise flag_error(exc, EngineConfig) from None


def flag_error(exc: ValidationError, model: type[BaseModel]) -> ConfigError:
    """A validation error of values given as flags, naming the flags."""
    return config_error(exc, "", model.model_fields, label=flag)


def known_keys(*models: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """What a ``--config`` file may set: ``model``, and each field of ``models``."""
    known: dict[str, type[BaseModel] | None] = {"model": None}
    for model in models:
        known.update(dict.fromkeys(model.model_fields, model))
    return known


# -- how a field's type becomes a flag ---------------------------------------------------------


def _strip(annotation: Any) -> list[Any]:
    """The union's members, without None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _kind(annotation: Any) -> tuple[str, tuple[str, ...] | None, Any]:
    """("bool" | "choices" | "list" | "scalar", the choices, a list's item type)."""
    members = _strip(annotation)
    if members == [bool]:
        return "bool", None, None
    if len(members) == 1 and typing.get_origin(members[0]) is Literal:
        return "choices", tuple(str(c) for c in typing.get_args(members[0])), None
    if len(members) == 1 and typing.get_origin(members[0]) is list:
        return "list", None, typing.get_args(members[0])[0]
    return "scalar", None, None


def _is_path(annotation: Any) -> bool:
    return Path in _strip(annotation)


def _help(field: FieldInfo, extra: str = "") -> str:
    """The field's docstring as help: lower-case start, its default and ``extra`` appended."""
    text = (field.description or "").strip().rstrip(".").replace("%", "%%")
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    notes = [extra] if extra else []
    default = field.default
    if isinstance(default, bool):
        notes.append(f"default: {'on' if default else 'off'}")
    elif default is not None and isinstance(default, int | float | str) and "default" not in text:
        notes.append(f"default: {default}")
    return f"{text} ({'; '.join(notes)})" if notes else text


def _metavar(name: str, field: FieldInfo) -> str:
    if _is_path(field.annotation):
        return "DIR" if name.endswith("_dir") else "FILE"
    if name.endswith("_mb"):
        return "MB"
    if name.endswith("_s"):
        return "S"
    if name.endswith("_ms"):
        return "MS"
    members = _strip(field.annotation)
    if any(m is int or typing.get_origin(m) is typing.Annotated for m in members):
        return "N"
    return name.split("_")[-1].upper()


def _scalar_parser(field: FieldInfo) -> Any:
    """Convert and check one flag's text as the field's type (a usage error if it fails)."""
    annotation: Any = field.annotation
    if field.metadata:  # constraints (ge=1) of a field declared as Annotated[int, Field(...)]
        annotation = typing.Annotated.__class_getitem__((annotation, *field.metadata))  # type: ignore[attr-defined]

    def parse(text: str) -> Any:
        try:  # (the adapter is built when a flag is given, not for --help)
            return TypeAdapter(annotation).validate_python(text)
        except ValidationError as exc:
            reasons = dict.fromkeys(
                str(e["msg"]).removeprefix("Input should be ") for e in exc.errors()
            )
            raise argparse.ArgumentTypeError(
                f"{text!r}: should be {' or '.join(reasons)}"
            ) from None

    return parse


def _list_parser(model: type[BaseModel], name: str, item: Any) -> Any:
    """Split a flag's text on commas (not paths) and check the items.

    Integers stay integers (band indices); the field's own validators run (a usage error if
    they fail).
    """

    def parse(text: str) -> list[Any]:
        if item is Path:
            return [Path(text)]
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"empty item in {text!r}")
        values: list[Any] = parts
        if int in _strip(item):
            values = [int(p) if p.lstrip("-").isdigit() else p for p in parts]
        try:
            model.model_validate({name: values})
        except ValidationError as exc:
            mine = [e for e in exc.errors() if e["loc"] and e["loc"][0] == name]
            if mine:
                why = str(mine[0]["msg"]).removeprefix("Value error, ")
                if len(mine[0]["loc"]) > 1:  # one item of the list: say which
                    why = f"{mine[0]['input']!r}: {why}"
                raise argparse.ArgumentTypeError(why) from None
        return values

    return parse
