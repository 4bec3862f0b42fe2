"""The ``geoserve`` command line: ``geoserve predict`` and ``geoserve models``.

Exit codes: 0 success, 1 an input or model error (one line naming the file, band or model; a
traceback only with ``--debug``), 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from geoserve.errors import ConfigError, GeoServeError, InputError, PluginLoadError
from geoserve.progress import Progress
from geoserve.raster.grid import BLEND_MODES
from geoserve.schemas import OUTPUT_KINDS, ImageRequestOutput

DEFAULT_MODEL = "demo-water"


def _bands(text: str) -> list[int | str]:
    out: list[int | str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise argparse.ArgumentTypeError(f"empty band in {text!r}")
        out.append(int(part) if part.lstrip("-").isdigit() else part)
    return out


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _model_options() -> argparse.ArgumentParser:
    """Options shared by ``predict`` and ``serve``: which model, and where and how it runs."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-m",
        "--model",
        default=DEFAULT_MODEL,
        help=f"registered model name (default: {DEFAULT_MODEL}; see `geoserve models`)",
    )
    common.add_argument("--weights", metavar="FILE", help="local weights file for the model")
    common.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1)")
    common.add_argument("--dtype", help="autocast dtype on the device: bf16 or fp16")
    common.add_argument(
        "--threads",
        type=_positive,
        metavar="N",
        help="torch CPU threads for the model (default: torch's choice)",
    )
    common.add_argument(
        "--batch-size",
        "--max-batch-patches",
        dest="batch_size",
        type=_batch_size,
        default=16,
        metavar="N",
        help="most patches per forward pass, from all pending requests (default 16); "
        "'auto' sizes it from free GPU memory",
    )
    perf = common.add_argument_group("pipeline and speed (see docs/performance.md)")
    perf.add_argument(
        "--compile", action="store_true", help="torch.compile the model (worth it on a GPU)"
    )
    perf.add_argument(
        "--read-workers",
        type=_positive,
        metavar="N",
        help="reader threads, also GDAL's decoding threads (default: cores, at most 4)",
    )
    perf.add_argument(
        "--prefetch-rows",
        type=int,
        default=2,
        metavar="N",
        help="grid rows each input keeps read ahead of the model (default 2)",
    )
    perf.add_argument(
        "--preprocess",
        choices=("auto", "host", "device"),
        default="auto",
        help="where patches are cast, normalised and cut (default: device on CUDA)",
    )
    perf.add_argument(
        "--cog", action="store_true", help="write Cloud-Optimized GeoTIFFs (tiles + overviews)"
    )
    common.add_argument(
        "--allowed-formats",
        type=_formats,
        default=["GTiff"],
        metavar="F,F",
        help="GDAL formats inputs may be in (default GTiff, which covers COG; also "
        "JP2OpenJPEG, PNG, JPEG); anything else is refused unread",
    )
    return common


def _formats(text: str) -> list[str]:
    from geoserve.raster.trust import check_formats

    try:
        return list(check_formats(text.split(",")))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("allowed input formats: ")) from None


def _batch_size(text: str) -> int | str:
    return "auto" if text == "auto" else _positive(text)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="geoserve", description="Serve image-to-image geospatial models on GeoTIFFs."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    common = _model_options()

    p = sub.add_parser("predict", parents=[common], help="run a model on GeoTIFFs, write GeoTIFFs")
    p.add_argument("inputs", nargs="+", metavar="IN", help="input GeoTIFF(s)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="output file (one input) or directory (several inputs)",
    )
    p.add_argument("--patch-size", type=_positive, metavar="N", help="patch size in pixels")
    p.add_argument("--stride", type=_positive, metavar="N", help="step between patches")
    p.add_argument("--blend", choices=BLEND_MODES, help="how overlapping patches combine")
    p.add_argument(
        "--bands",
        type=_bands,
        metavar="LIST",
        help="comma-separated 0-based band indices or band descriptions, e.g. 1,2,3 or B3,B8",
    )
    p.add_argument(
        "--output-kind",
        choices=OUTPUT_KINDS,
        help="classes, probabilities or raw (default: the model's own)",
    )
    p.add_argument(
        "--time-series",
        action="store_true",
        help="treat all inputs as the dates of one place (one output)",
    )
    p.add_argument(
        "--dates",
        metavar="D,D",
        help="acquisition dates of the inputs, one per input in order, as comma-separated ISO "
        "dates (2020-06-01,2020-07-01); they win over date tags and file-name stamps",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the scenes on a Ray cluster (ADDRESS, or 'auto'; a local one when omitted); "
        "-o is a directory; needs geoserve[ray]",
    )
    p.add_argument(
        "--ray-actors",
        type=_positive,
        default=2,
        metavar="N",
        help="engines running at once on Ray (default 2)",
    )
    p.add_argument(
        "--cpus-per-actor",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs reserved per Ray actor (default 1)",
    )
    p.add_argument(
        "--gpus-per-actor",
        type=float,
        default=0.0,
        metavar="N",
        help="GPUs per Ray actor (default 0; 1 = one engine per GPU)",
    )
    p.add_argument(
        "--quicklook",
        metavar="PNG",
        help="also draw input and prediction side by side (a directory for several inputs)",
    )
    p.add_argument(
        "--max-patches",
        type=int,
        default=200_000,
        metavar="N",
        help="refuse inputs of more than N patches (default 200000, about 100000 px square; "
        "0: no limit)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )

    s = sub.add_parser(
        "serve", parents=[common], help="serve a model over HTTP (needs geoserve[server])"
    )
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    s.add_argument(
        "--max-wait-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="wait up to MS (from the oldest pending request) to fill a batch",
    )
    s.add_argument(
        "--no-cross-request-batching",
        dest="cross_request_batching",
        action="store_false",
        help="one request's patches per batch (benchmarks)",
    )
    s.add_argument(
        "--max-queued-patches",
        type=_positive,
        default=4096,
        metavar="N",
        help="admission bound; beyond it 503 with Retry-After",
    )
    s.add_argument(
        "--request-timeout",
        dest="request_timeout_s",
        type=float,
        default=120.0,
        metavar="S",
        help="drop requests unfinished after S seconds (504)",
    )
    s.add_argument(
        "--max-body-mb",
        type=float,
        default=200.0,
        metavar="MB",
        help="largest request body (413 beyond)",
    )
    s.add_argument(
        "--max-pixels",
        type=_positive,
        default=400_000_000,
        metavar="N",
        help="largest decoded request: width*height*bands*dates (413 beyond)",
    )
    s.add_argument(
        "--max-memory-mb",
        type=float,
        default=1024.0,
        metavar="MB",
        help="estimated memory all admitted requests may hold together (413 for one alone "
        "over it, 503 beside others; see docs/serving.md)",
    )
    s.add_argument(
        "--allowed-input-dir",
        dest="allowed_input_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="allow 'path' inputs under DIR (repeatable)",
    )
    s.add_argument(
        "--allowed-url-domain",
        dest="allowed_url_domains",
        action="append",
        default=[],
        metavar="HOST",
        help="allow 'url' inputs from HOST (repeatable)",
    )
    s.add_argument(
        "--url-reads",
        choices=("range", "download"),
        default="range",
        help="read URL inputs in place by range requests when the host allows (default), "
        "or download them whole first",
    )
    s.add_argument("--output-dir", metavar="DIR", help="allow 'path' outputs, written in DIR")
    s.add_argument("--api-key", help="require this key (or set GEOSERVE_API_KEY)")
    s.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="serve replicas on Ray Serve (ADDRESS or 'auto'; a local cluster when omitted)",
    )
    s.add_argument(
        "--replicas",
        type=_positive,
        default=2,
        metavar="N",
        help="Ray Serve replicas, each with its own engine (default 2)",
    )
    s.add_argument(
        "--gpus-per-replica",
        type=float,
        default=0.0,
        metavar="N",
        help="GPUs per replica (default 0)",
    )
    s.add_argument(
        "--shutdown-timeout",
        dest="shutdown_timeout_s",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, let in-flight requests finish for S seconds",
    )
    s.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )

    i = sub.add_parser("info", help="describe a raster; with --model, whether it fits")
    i.add_argument("input", metavar="IN", help="a GeoTIFF")
    i.add_argument("-m", "--model", help="check the file against this model's needs")
    i.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )

    m = sub.add_parser("models", help="list registered models")
    m.add_argument("--json", action="store_true", help="every detail, as JSON (for scripts)")
    m.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    return parser


def _cmd_models(args: argparse.Namespace) -> int:
    from geoserve.catalog import format_table, model_entries

    entries = model_entries()
    if args.json:
        print(json.dumps([e.as_json() for e in entries], indent=2))
    else:
        print("\n".join(format_table(entries, shutil.get_terminal_size((100, 24)).columns)))
    return 0


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """``predict``'s engine options, the same for a local run and on Ray."""
    return {
        "weights": args.weights,
        "device": args.device,
        "dtype": args.dtype,
        "patch_size": args.patch_size,
        "stride": args.stride,
        "blend": args.blend,
        "bands": args.bands,
        "output_kind": args.output_kind,
        "max_batch_patches": args.batch_size,
        "compile": args.compile,
        "read_workers": args.read_workers,
        "prefetch_rows": args.prefetch_rows,
        "preprocess": args.preprocess,
        "cog": args.cog,
        "allowed_formats": args.allowed_formats,
        "max_patches": args.max_patches or None,
    }


def _cmd_predict_ray(args: argparse.Namespace) -> int:
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

    inputs, address = list(args.inputs), None if args.ray == "local" else args.ray
    if address is not None and Path(address).exists():  # `--ray IN ...`: no address given
        inputs, address = [address, *inputs], None
    summary = run_batch(
        inputs,
        args.output,
        model=args.model,
        address=address,
        actors=args.ray_actors,
        cpus_per_actor=args.cpus_per_actor,
        gpus_per_actor=args.gpus_per_actor,
        on_result=show,
        **_engine_options(args),
    )
    if not args.quiet:
        for result in summary.results:
            if result.skipped:
                print(f"skipped {result.path}: {result.output} exists")
        print(summary.line())
    return 1 if summary.failed else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: no partial output is left


def _cmd_predict(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    if args.dates is not None:
        from geoserve.raster.dates import request_dates

        if args.ray:
            raise ConfigError("--dates cannot be combined with --ray")
        args.dates = request_dates(args.dates.split(","), len(args.inputs), "--dates")
    if args.ray:
        return _cmd_predict_ray(args)
    bad = _unreadable_inputs(args)
    if bad and (args.time_series or len(bad) == len(args.inputs)):
        if len(args.inputs) > 1 and not args.time_series and not args.quiet:
            print(f"0 of {len(args.inputs)} inputs done, {len(args.inputs)} failed")
        return 1  # nothing left to run: don't load the model
    with _notice(f"loading model {args.model}…", quiet=args.quiet):
        from geoserve.engine import Engine, resolve_model  # (torch's import: most of the wait)

        _check_layout(args, resolve_model(args.model)[1].num_frames)  # before weights load
        engine = Engine(args.model, **_engine_options(args))
    with engine:  # Ctrl-C closes it: unfinished outputs are removed, never left partial
        return _predict_all(engine, args, skip=bad)


def _unreadable_inputs(args: argparse.Namespace) -> set[str]:
    """The local inputs that cannot be read, reported before the model loads.

    Each is opened once (milliseconds; loading a model takes seconds); the others still run.
    """
    from geoserve.raster.source import open_raster

    bad = set()
    for name in args.inputs:
        if "://" in name:
            continue  # a URL is read, and reported, by its own request
        try:
            open_raster(name, "path", formats=args.allowed_formats).close()
        except GeoServeError as exc:
            print(f"geoserve: error: {exc}", file=sys.stderr)
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


def _predict_all(engine: Any, args: argparse.Namespace, skip: set[str]) -> int:
    """Run every input (but those in ``skip``, already reported unreadable); 1 if any failed."""
    from geoserve.raster.sinks import output_paths

    out = Path(args.output)
    items: list[Any] = [list(args.inputs)] if args.time_series else list(args.inputs)
    dates = [args.dates] if args.time_series else args.dates or [None] * len(items)
    if len(items) == 1:
        target = out / f"{Path(args.inputs[0]).stem}_pred.tif" if out.is_dir() else out
        paths: list[Path | None] = [target]
    else:
        out.mkdir(parents=True, exist_ok=True)
        paths = list(output_paths(items, out))
    t0 = time.perf_counter()
    for item, path, when in zip(items, paths, dates, strict=False):
        if isinstance(item, list) or item not in skip:
            engine.add_request(item, output_path=path, request_id=str(path), dates=when)
    total = engine.queued_patches
    progress = None
    if not args.quiet and total:
        progress = Progress(total, sys.stderr, tty=sys.stderr.isatty())
    failed, patches = sum(1 for name in args.inputs if name in skip), 0
    quicklooks = _quicklook_paths(args, items, paths)
    if quicklooks:  # import matplotlib while the model runs, not after it
        from geoserve.quicklook import preload

        threading.Thread(target=preload, name="geoserve-quicklook-import", daemon=True).start()
    while engine.has_unfinished():
        results = engine.step()
        if progress is not None:
            progress.update(total - engine.queued_patches, final=not engine.has_unfinished())
        for result in results:
            patches += result.num_patches
            failed += _report(result, args, quicklooks, engine.in_proc)
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
) -> int:
    """Print one finished request, then draw its quicklook; 1 if it failed."""
    if result.error is not None:
        if args.debug:
            traceback.print_exception(result.error)
        print(f"geoserve: error: {result.error}", file=sys.stderr)
        return 1
    o = result.outputs
    assert o is not None
    if not args.quiet:
        print(
            f"wrote {o.path} ({o.width}x{o.height}, {o.count} band(s) {o.dtype}, "
            f"{result.num_patches} patches, {result.timings.total:.2f} s)",
            flush=True,
        )
    if result.request_id in quicklooks:
        from geoserve.quicklook import model_band_roles, render_quicklook

        item, png = quicklooks[result.request_id]
        first = item[0] if isinstance(item, list) else item
        assert o.path is not None
        if not args.quiet:
            print("drawing quicklook…", file=sys.stderr, flush=True)
        render_quicklook(first, o.path, png, roles=model_band_roles(in_proc, first))
        if not args.quiet:
            print(f"wrote {png} (quicklook)")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from geoserve.raster.coords import acquisition_date, centre_lonlat
    from geoserve.raster.source import open_raster

    with open_raster(args.input) as src:
        info = src.info
        print(f"file:      {info.name}")
        print(f"size:      {info.width} x {info.height} pixels, {info.count} band(s) {info.dtype}")
        if info.is_georeferenced:
            epsg = info.crs.to_epsg()
            unit = "deg" if info.crs.is_geographic else "m"
            print(f"crs:       {f'EPSG:{epsg}' if epsg else info.crs.to_string()}")
            print(f"pixel:     {abs(info.transform.a):.6g} x {abs(info.transform.e):.6g} {unit}")
            lon, lat = centre_lonlat(info)
            print(f"centre:    lon {lon:.5f}, lat {lat:.5f}")
        else:
            print("crs:       none (not georeferenced)")
        print(f"nodata:    {info.nodata if info.nodata is not None else 'none declared'}")
        print(f"layout:    {_layout(info.profile)}")
        try:
            print(f"date:      {acquisition_date(info).isoformat()}")
        except GeoServeError:
            print("date:      unknown")
        for i, desc in enumerate(info.descriptions):
            print(f"band {i:2d}:   {desc or '(no description)'}")
        if not args.model:
            return 0
        return _check_fit(args.model, src)


def _layout(profile: Any) -> str:
    """How the pixels are stored (blocks are the unit GDAL decodes)."""
    compress = str(profile.get("compress") or "uncompressed").lower()
    if profile.get("tiled"):
        return f"tiles of {profile['blockxsize']} x {profile['blockysize']}, {compress}"
    rows = profile.get("blockysize")
    if rows is None:
        return "in memory"
    return f"strips of {rows} row(s), {compress}"


def _check_fit(model: str, src: Any) -> int:
    from geoserve.engine import resolve_model

    spec, in_proc, _ = resolve_model(model)
    try:
        ctx = in_proc.prepare([src] * in_proc.num_frames)
    except GeoServeError as exc:
        print(f"fits {spec.name}: no: {exc}")
        return 1
    names = ", ".join(ctx.band_names)
    detail = (
        f"bands {', '.join(map(str, ctx.bands))}: {names}; "
        f"{len(ctx.grid)} patches of {ctx.grid.patch_size} px"
    )
    if in_proc.num_frames > 1:
        n = in_proc.num_frames
        print(
            f"fits {spec.name}: needs {n} dates; this file can be one of them ({detail}); "
            f"predict takes {n} such files of one place with --time-series"
        )
        return 0
    print(f"fits {spec.name}: yes ({detail})")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from geoserve.server.run import serve
        from geoserve.server.settings import ServerSettings
    except ImportError as exc:
        raise PluginLoadError(
            f"the server needs the 'server' extra: pip install 'geoserve[server]' ({exc})"
        ) from exc
    from pydantic import ValidationError

    fields = set(ServerSettings.model_fields)
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values["max_batch_patches"] = args.batch_size
    if values.get("api_key") is None:
        values.pop("api_key", None)
    try:
        settings = ServerSettings(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "-".join(map(str, first["loc"])).replace("_", "-")
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"--{flag}: {message}") from None
    for directory in [*settings.allowed_input_dirs, settings.output_dir]:
        if directory is not None and not directory.is_dir():
            raise ConfigError(f"{directory}: not a directory")
    logging.getLogger("geoserve").setLevel(logging.INFO)
    if args.ray:
        from geoserve.distributed.serving import serve_on_ray

        serve_on_ray(
            settings,
            address=None if args.ray == "local" else args.ray,
            replicas=args.replicas,
            gpus_per_replica=args.gpus_per_replica,
        )
        return 0
    return serve(settings)


def _format_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> str:
    return f"geoserve: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="geoserve: %(levelname)s: %(message)s")
    if args.debug:
        logging.getLogger("geoserve.plugins").setLevel(logging.DEBUG)  # a plugin's traceback
    else:
        warnings.formatwarning = _format_warning
    try:
        if args.command == "models":
            return _cmd_models(args)
        if args.command == "serve":
            return _cmd_serve(args)
        if args.command == "info":
            return _cmd_info(args)
        return _cmd_predict(args)
    except GeoServeError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"geoserve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("geoserve: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `geoserve models | head`: the reader has gone, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        print(
            f"geoserve: unexpected error: {exc!r} (rerun with --debug for details)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
