"""``geoserve serve``: the HTTP server, on this machine or as Ray Serve replicas."""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from pydantic import ValidationError

from geoserve.cli.configured import chosen_model, planned_models, register_configured_models
from geoserve.cli.options import engine_config, flag_error, given, known_keys, read_options
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

    from_file = read_options(args.config, known_keys(EngineConfig, ServerFields))
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
    named = getattr(args, "model", None) or from_file.get("model")
    planned = planned_models(args, models_dir=fields.models_dir, model=named)
    model = chosen_model(named, [m.name for m in planned], DEFAULT_MODEL)
    settings = ServerSettings.model_validate(
        {**fields.model_dump(exclude_unset=True), "model": model, "engine": engine}
    )
    settings.check_weights_source()
    return settings


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
