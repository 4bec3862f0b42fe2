"""``geoserve predict``: run a model on GeoTIFFs here (or on a Ray cluster), write GeoTIFFs.

With ``--server URL`` the same requests run as jobs of a geoserve server instead
(:mod:`geoserve.cli.remote`).

Inputs are files (``IN ...``: each a request, or with ``--time-series`` the dates of one) or
modalities (``-i NAME=SOURCE ...``: together one request, see :mod:`geoserve.cli.multimodal`).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from geoserve.cli.configured import chosen_model, register_configured_models
from geoserve.cli.multimodal import dates_of, reference_of, request_of, sources_of
from geoserve.cli.options import engine_config, known_keys, read_options
from geoserve.cli.parser import DEFAULT_MODEL
from geoserve.config import EngineConfig
from geoserve.errors import ConfigError, GeoServeError, InputError, NotGeoreferencedWarning
from geoserve.progress import Progress
from geoserve.schemas import ImageRequestOutput


def _predict_on_ray(args: argparse.Namespace, config: EngineConfig) -> int:
    if args.stac_item is not None:
        raise ConfigError("--stac-item cannot be combined with --ray")
    from geoserve.distributed import SceneResult, run_batch

    def show(result: SceneResult) -> None:
        if not result.ok:
            print(
                f"geoserve: error: {result.path}: {result.error} "
                f"(after {result.attempts} attempt(s))",
                file=sys.stderr,
            )
        elif not args.quiet:
            print(f"wrote {result.output} ({result.patches} patches, {result.seconds:.2f} s)")

    summary = run_batch(
        list(args.inputs),
        args.output,
        model=args.model,
        address=args.ray_address,
        actors=args.ray_actors,
        cpus_per_actor=args.cpus_per_actor,
        gpus_per_actor=args.gpus_per_actor,
        on_result=show,
        config=config,
        seed=args.seed,
    )
    if not args.quiet:
        for result in summary.results:
            if result.skipped:
                print(f"skipped {result.path}: {result.output} exists")
        print(summary.line())
    return 1 if summary.failed else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: no partial output is left


def cmd_predict(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``geoserve predict``: every input through the model; 1 if any failed."""
    signal.signal(signal.SIGTERM, _interrupt)
    from geoserve.cli.stac_search import search_of

    search = search_of(args, parser)
    request = _modality_request(args, parser) if search is None else None
    if search is not None:
        args.inputs = [search]  # (one request: the search, run where the model runs)
    from_file = read_options(args.config, known_keys(EngineConfig))
    if args.server is not None:  # the same requests as jobs of a geoserve server
        from geoserve.cli.remote import predict_remote

        return predict_remote(args, parser, request, from_file)
    config = engine_config(args, from_file)
    args.model = model_of(args, from_file.get("model"))
    settle_output_and_dates(args, parser, config, request)
    if args.ray:
        return _predict_on_ray(args, config)
    labelled = sources_of(request) if request else [(None, name) for name in args.inputs]
    bad = unreadable_inputs(labelled, config.allowed_formats)
    if bad and request is not None:
        return 1  # one request: it cannot run without all its modalities
    if bad and (args.time_series or len(bad) == len(args.inputs)):
        if len(args.inputs) > 1 and not args.time_series and not args.quiet:
            print(f"0 of {len(args.inputs)} inputs done, {len(args.inputs)} failed")
        return 1  # nothing left to run: don't load the model
    with _notice(f"loading model {args.model}…", quiet=args.quiet):
        from geoserve.engine import Engine, resolve_model  # (torch's import: most of the wait)

        if request is None and search is None:  # (a dict's, a search's: checked on open)
            _check_layout(args, resolve_model(args.model)[1].num_frames)  # before weights load
        engine = Engine(args.model, config)
    with engine:  # Ctrl-C closes it: unfinished outputs are removed, never left partial
        return _predict_all(engine, args, skip=bad, request=request)


def settle_output_and_dates(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    config: EngineConfig,
    request: dict[str, Any] | None,
) -> None:
    """Settle where outputs go and the explicit dates (local runs and ``--server`` alike).

    ``args.output``: ``-o``, else the output directory (created); ``args.dates`` parsed: one
    per input, or with ``-i`` modality -> dates.
    """
    if args.output is None:
        if config.output_dir is None:
            parser.error("predict: give -o OUT (or --output-dir DIR, or output_dir in --config)")
        try:
            config.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"output_dir: {config.output_dir}: {exc.strerror or exc}") from None
        args.output = str(config.output_dir)
    if args.dates is not None:
        from geoserve.raster.dates import request_dates

        if args.ray:
            raise ConfigError("--dates cannot be combined with --ray")
        if request is not None:
            args.dates = dates_of(args.dates, request)
        else:
            args.dates = request_dates(args.dates.split(","), len(args.inputs), "--dates")


def model_of(args: argparse.Namespace, in_file: str | None) -> str:
    """The model to run: ``--model`` (or the ``--config`` file's), or the one registered.

    Registers the models ``--config-file``, ``--register`` and ``--models-dir`` name.
    """
    given = getattr(args, "model", None) or in_file
    if args.ray and (args.config_file or args.register or args.models_dir):
        raise ConfigError(
            "--config-file, --register and --models-dir register a model in this process; "
            "Ray's actors would not know it: run without --ray"
        )
    return chosen_model(given, register_configured_models(args, model=given), DEFAULT_MODEL)


def _modality_request(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> dict[str, Any] | None:
    """The ``-i`` options as one request (modality -> source or dates); None for files.

    Usage errors: no input at all, files and ``-i`` together, ``-i`` with ``--time-series``
    or ``--ray``.
    """
    if not args.modalities:
        if not args.inputs:
            parser.error("predict: give input files (IN ...) or modalities (-i NAME=SOURCE ...)")
        return None
    if args.inputs:
        files = args.inputs[0] + (" ..." if len(args.inputs) > 1 else "")
        name, source = args.modalities[0]
        parser.error(
            f"predict: give input files ({files}) or modalities (-i {name}={source}), not both"
        )
    if args.time_series:
        parser.error(
            "predict: --time-series is for input files; with -i, give a modality's dates by "
            "repeating its name (-i s2=june.tif -i s2=july.tif)"
        )
    if args.ray:
        parser.error("predict: --ray runs input files, one request each; it does not take -i")
    return request_of(args.modalities)


def unreadable_inputs(inputs: Sequence[tuple[str | None, str]], formats: Sequence[str]) -> set[str]:
    """The local inputs that cannot be read, reported before the model loads.

    ``inputs``: (modality or None, source) pairs. Each is opened once (milliseconds; loading
    a model takes seconds); the others still run.
    """
    from geoserve.raster.source import open_raster
    from geoserve.raster.stac_item import is_stac_input

    bad = set()
    for modality, name in inputs:
        if not isinstance(name, str) or "://" in name or is_stac_input(name):
            continue  # a URL or a STAC Item is read, and reported, by its own request
        try:
            with warnings.catch_warnings():  # (its own request warns of it, once)
                warnings.simplefilter("ignore", NotGeoreferencedWarning)
                open_raster(name, "path", formats=formats).close()
        except GeoServeError as exc:
            where = f"modality {modality!r}: " if modality is not None else ""
            print(f"geoserve: error: {where}{exc}", file=sys.stderr)
            bad.add(name)
    return bad


@contextlib.contextmanager
def _notice(text: str, *, quiet: bool, after_s: float = 0.5) -> Iterator[None]:
    """Print ``text`` on a terminal if what it announces takes longer than ``after_s``."""
    timer = None
    if not quiet and sys.stderr.isatty():
        timer = threading.Timer(after_s, lambda: print(text, file=sys.stderr, flush=True))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def _check_layout(args: argparse.Namespace, frames: int) -> None:
    """Refuse inputs the model cannot take as given, and outputs that cannot be written."""
    if frames > 1 and not (args.time_series and len(args.inputs) == frames):
        got = f"{len(args.inputs)} file(s){'' if args.time_series else ' without --time-series'}"
        raise InputError(
            f"model {args.model!r} takes {frames} dates per request, got {got}: give the "
            f"{frames} files of one place with --time-series (and their dates with --dates if "
            "their tags and file names carry none)"
        )
    out = Path(args.output)
    if not args.time_series and len(args.inputs) > 1 and out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out}: exists and is not a directory (several inputs need one)")


def _predict_all(
    engine: Any, args: argparse.Namespace, skip: set[str], request: dict[str, Any] | None = None
) -> int:
    """Run every input (but those in ``skip``, already reported unreadable); 1 if any failed.

    ``request``: the modalities given with ``-i``, the one request (instead of the files).
    """
    items: list[Any] = [list(args.inputs)] if args.time_series else list(args.inputs)
    if request is not None:
        items = [request]
    one = args.time_series or request is not None
    dates = [args.dates] if one else args.dates or [None] * len(items)
    on = f" on {reference_of(engine.in_proc, list(request)).label()}" if request else ""
    # the engine's rule (a directory holds outputs named after each input, created if
    # missing; a single input's path that is no directory is its file or, with several
    # kinds, their stem)
    try:
        paths: list[Path | None] = list(
            engine.output_paths(items, args.output, single=len(items) == 1)
        )
    except ConfigError as exc:
        raise ConfigError(f"-o {exc}") from None
    from geoserve.engine.request_spec import RequestSpec  # (torch is loaded by now)

    t0 = time.perf_counter()
    for item, path, when in zip(items, paths, dates, strict=False):
        if isinstance(item, list | dict) or item not in skip:
            spec = RequestSpec(
                item, request_id=str(path), output_path=path, dates=when, seed=args.seed
            )
            engine.add_request(spec)
    total = engine.queued_patches
    progress = None
    if not args.quiet and total:
        progress = Progress(total, sys.stderr, tty=sys.stderr.isatty())
    failed, patches = sum(1 for name in args.inputs if name in skip), 0
    quicklooks = _quicklook_paths(args, items, paths)
    from geoserve.cli.stac_items import ItemWriter, plan_items

    write_item = ItemWriter(
        engine, plan_items(args.stac_item, items, paths, dates, args.seed), quiet=args.quiet
    )
    if quicklooks:  # import matplotlib while the model runs, not after it
        from geoserve.quicklook import preload

        threading.Thread(target=preload, name="geoserve-quicklook-import", daemon=True).start()

    def show(stitched: int, _total: int) -> None:
        if progress is not None:
            progress.update(min(stitched, total), final=not engine.has_unfinished())

    for result in engine.run_until_done(show):
        patches += result.num_patches
        failed += _report(result, args, quicklooks, engine.in_proc, on)
        failed += write_item(result)
    if not args.quiet and len(items) > 1:
        dt = time.perf_counter() - t0
        print(
            f"{len(items) - failed} of {len(items)} inputs done, {failed} failed, "
            f"{patches} patches in {dt:.1f} s ({patches / max(dt, 1e-9):.1f} patches/s)"
        )
    return 1 if failed else 0


def _quicklook_paths(
    args: argparse.Namespace, items: list[Any], paths: list[Path | None]
) -> dict[str, tuple[Any, Path]]:
    """Request id -> (input, PNG path) when --quicklook was given."""
    if not args.quicklook:
        return {}
    target = Path(args.quicklook)
    if len(items) == 1:
        return {str(paths[0]): (items[0], target)}
    target.mkdir(parents=True, exist_ok=True)
    return {
        str(path): (item, target / f"{Path(str(path)).stem}.png")
        for item, path in zip(items, paths, strict=True)
    }


def _report(
    result: ImageRequestOutput | Any,
    args: argparse.Namespace,
    quicklooks: dict[str, Any],
    in_proc: Any = None,
    on: str = "",
) -> int:
    """Print one finished request, then draw its quicklook; 1 if it failed.

    ``on``: words saying which grid a request of modalities is on (`` on the grid of s2``).
    """
    if result.error is not None:
        if args.debug:
            traceback.print_exception(result.error)
        print(f"geoserve: error: {result.error}", file=sys.stderr)
        return 1
    from geoserve.schemas import VECTOR_KINDS

    raster = None
    for o in result.outputs_by_kind.values():
        vector = o.kind in VECTOR_KINDS
        raster = raster or (None if vector else o)
        if args.quiet:
            continue
        what = f"{o.count} polygons, {o.dtype}" if vector else f"{o.count} band(s) {o.dtype}"
        print(
            f"wrote {o.path} ({o.width}x{o.height}{on}, {what}, "
            f"{result.num_patches} patches, {result.timings.total:.2f} s)",
            flush=True,
        )
    if result.request_id in quicklooks and raster is None:
        print("no quicklook: no raster output to draw (polygons only)", file=sys.stderr)
    elif result.request_id in quicklooks:
        o = raster
        assert o is not None
        from geoserve.quicklook import model_band_roles, render_quicklook

        item, png = quicklooks[result.request_id]
        first = _drawn(item, in_proc)
        assert o.path is not None
        from geoserve.raster.stac_item import is_stac_input

        if is_stac_input(first):
            print(f"no quicklook of {first}: a STAC Item input is not drawn", file=sys.stderr)
            return 0
        if not args.quiet:
            print("drawing quicklook…", file=sys.stderr, flush=True)
        render_quicklook(first, o.path, png, roles=model_band_roles(in_proc, first))
        if not args.quiet:
            print(f"wrote {png} (quicklook)")
    return 0


def _drawn(item: Any, in_proc: Any) -> Any:
    """The input a quicklook draws: the first date; of modalities, the reference's."""
    if isinstance(item, dict):
        item = item[reference_of(in_proc, list(item)).name]
    return item[0] if isinstance(item, list) else item
