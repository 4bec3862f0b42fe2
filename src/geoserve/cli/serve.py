"""``geoserve serve``: the HTTP server, on this machine or as Ray Serve replicas."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from geoserve.cli.configured import chosen_model, planned_models, register_configured_models
from geoserve.cli.options import (
    _file_path,
    _is_path,
    engine_config,
    flag_error,
    given,
    known_keys,
    read_options,
)
from geoserve.cli.parser import DEFAULT_MODEL
from geoserve.config import EngineConfig, config_error
from geoserve.errors import ConfigError, PluginLoadError

if TYPE_CHECKING:
    from geoserve.server.settings import ServerSettings


def server_settings(args: argparse.Namespace) -> ServerSettings:
    """The :class:`~geoserve.server.settings.ServerSettings` of this command line.

    Flags win over the ``--config`` file, which wins over the defaults.

    Raises:
        ConfigError: naming the file and key, or the flag, at fault.
    """
    from geoserve.server.settings import ServerFields, ServerSettings

    known = {**known_keys(EngineConfig, ServerFields), "models": None}
    from_file = read_options(args.config, known)
    engine = engine_config(args, from_file)
    server_file = {k: v for k, v in from_file.items() if k in ServerFields.model_fields}
    try:
        ServerFields.model_validate(server_file)
    except ValidationError as exc:
        raise config_error(exc, str(args.config), ServerFields.model_fields) from None
    try:
        fields = ServerFields.model_validate({**server_file, **given(args, ServerFields)})
    except ValidationError as exc:
        raise flag_error(exc, ServerFields) from None
    for directory in fields.allowed_input_dirs:
        if not directory.is_dir():
            why = "not a directory" if directory.exists() else "does not exist"
            raise ConfigError(f"allowed_input_dirs: {directory}: {why}")
    out = engine.output_dir
    if out is not None and out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir: {out}: not a directory")
    if out is not None:  # created if missing, as predict does
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise ConfigError(f"output_dir: {out}: cannot create the directory ({why})") from None
    models = served_models(args, from_file, engine, fields)
    named = getattr(args, "model", None) or from_file.get("model")
    if len(models) > 1 or (models and not getattr(args, "model", None)):
        flags = getattr(args, "model_list", None)  # (several: the first is the model)
        named = flags[0] if flags and flags[0] != "*" else from_file.get("model") or models[0].name
    planned = planned_models(args, models_dir=fields.models_dir, model=named)
    model = chosen_model(named, [m.name for m in planned], DEFAULT_MODEL)
    try:
        settings = ServerSettings.model_validate(
            {
                **fields.model_dump(exclude_unset=True),
                "model": model,
                "engine": engine,
                "models": models,
            }
        )
    except ValidationError as exc:  # (a check across the models: names twice, model not one)
        raise ConfigError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None
    settings.check_weights_source()
    return settings


def served_models(
    args: argparse.Namespace, from_file: Mapping[str, Any], engine: EngineConfig, fields: Any
) -> list[Any]:
    """The models to serve side by side (``ServedModel``s); empty: one model, as always.

    ``--model`` given more than once names them; else the ``--config`` file's ``models:``
    list. A name the file's list has keeps its engine options there, each over the top-level
    ones (``engine``). ``--model`` given once serves that model alone (with its options from the
    file's list, if it is there). ``*`` (as a flag or an entry) stands for every model that
    runs without a weights file given (:func:`every_model`), less those named elsewhere.

    Raises:
        ConfigError: naming the file, the entry and the option at fault.
    """
    from geoserve.server.settings import ServedModel, served_model

    source = str(args.config)
    listed = from_file.get("models")
    if listed is not None and not isinstance(listed, list):
        raise ConfigError(f"{source}: models: a list of model names or of name and engine options")
    entries = [_relative_paths(e, source) for e in listed or []]
    by_name = {e.get("name") if isinstance(e, Mapping) else e: e for e in entries}
    names = list(dict.fromkeys(getattr(args, "model_list", None) or []))
    where = {id(e): f"{source}: models[{i}]" for i, e in enumerate(entries)}
    if names:
        if len(names) == 1 and names[0] not in by_name and names[0] != "*":
            return []
        entries = [by_name.get(n, n) for n in names]
    if "*" in entries:
        rest = [n for n in every_model(args, fields) if n not in by_name and n not in names]
        at = entries.index("*")
        entries = [*entries[:at], *rest, *(e for e in entries[at + 1 :] if e != "*")]
    base = engine.model_dump(exclude_unset=True)
    return [ServedModel(**served_model(e, base, where.get(id(e), f"--model {e}"))) for e in entries]


def every_model(args: argparse.Namespace, fields: Any) -> list[str]:
    """``--model '*'``: every registered model that runs without a weights file given.

    Those of geoserve and the installed plugins with built-in weights (and, with
    ``--allow-hub-weights``, those that fetch published weights), then the fine-tunes of
    ``--models-dir`` and ``--register``.

    Raises:
        ConfigError: as :func:`~geoserve.cli.configured.planned_models`; none at all.
    """
    from geoserve.catalog import servable_models

    names = servable_models(hub=fields.allow_hub_weights)
    planned = planned_models(args, models_dir=fields.models_dir)
    names += [m.name for m in planned if m.name not in names]
    if not names:
        raise ConfigError("--model '*': no registered model runs without a weights file")
    return names


def _relative_paths(entry: Any, source: str) -> Any:
    """A ``models`` entry's paths (``weights``) taken relative to the config file, as at the top."""
    if not isinstance(entry, Mapping):
        return entry
    base = Path(source).parent.absolute()
    out = dict(entry)
    for key, value in entry.items():
        field = EngineConfig.model_fields.get(key)
        if field is not None and _is_path(field.annotation) and isinstance(value, str):
            out[key] = _file_path(base, value, source, f"models: {key}")
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    """``geoserve serve``: run the HTTP server until it is stopped."""
    try:
        from geoserve.server.run import serve
    except ImportError as exc:
        raise PluginLoadError(
            f"the server needs the 'server' extra: pip install 'geoserve[server]' ({exc})"
        ) from exc
    settings = server_settings(args)
    logging.getLogger("geoserve").setLevel(logging.INFO)
    if args.ray and (args.config_file or args.register):
        raise ConfigError(
            "--config-file and --register register a model in this process; Ray Serve's "
            "replicas would not know it: use models_dir (--models-dir) with --ray"
        )
    register_configured_models(args, models_dir=settings.models_dir, model=settings.model)
    if args.ray:
        from geoserve.distributed.serving import serve_on_ray

        serve_on_ray(
            settings,
            address=args.ray_address,
            replicas=args.replicas,
            gpus_per_replica=args.gpus_per_replica,
        )
        return 0
    return serve(settings)
