"""The ``geoserve`` command line: ``geoserve predict`` and ``geoserve models``.

Exit codes: 0 success, 1 an input or model error (one line naming the file, band or model; a
traceback only with ``--debug``), 2 a usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geoserve.errors import GeoServeError
from geoserve.processors.base import OUTPUT_KINDS
from geoserve.raster.grid import BLEND_MODES
from geoserve.schemas import ImageRequestOutput

DEFAULT_MODEL = "ndwi-water"


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="geoserve", description="Serve image-to-image geospatial models on GeoTIFFs."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("predict", help="run a model on GeoTIFFs, write GeoTIFFs")
    p.add_argument("inputs", nargs="+", metavar="IN", help="input GeoTIFF(s)")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="output file (one input) or directory (several inputs)",
    )
    p.add_argument(
        "-m",
        "--model",
        default=DEFAULT_MODEL,
        help=f"registered model name (default: {DEFAULT_MODEL}; see `geoserve models`)",
    )
    p.add_argument("--weights", metavar="FILE", help="local weights file for the model")
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
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1)")
    p.add_argument("--dtype", help="autocast dtype on the device: bf16 or fp16")
    p.add_argument(
        "--batch-size",
        type=_positive,
        default=16,
        metavar="N",
        help="most patches per forward pass (default 16)",
    )
    p.add_argument(
        "--time-series",
        action="store_true",
        help="treat all inputs as the dates of one place (one output)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )

    m = sub.add_parser("models", help="list registered models")
    m.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    return parser


def _cmd_models(args: argparse.Namespace) -> int:
    from geoserve.engine import resolve_model
    from geoserve.plugins import load_plugins
    from geoserve.registry import MODEL_REGISTRY

    load_plugins()
    rows = []
    for name, spec in MODEL_REGISTRY.items():
        try:
            _, inp, out = resolve_model(spec)
            selected = getattr(inp, "bands", None)
            bands = ",".join(map(str, selected)) if selected else "all"
            classes = ",".join(getattr(out, "classes", ())) or out.kind
        except GeoServeError as exc:
            bands, classes = "-", f"(unusable: {exc})"
        weights = "needs --weights" if spec.weights_required else "built in"
        rows.append((name, bands, classes, weights, spec.description))
    header = ("MODEL", "BANDS", "OUTPUT", "WEIGHTS", "DESCRIPTION")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    from geoserve.engine import Engine

    engine = Engine(
        args.model,
        weights=args.weights,
        device=args.device,
        dtype=args.dtype,
        patch_size=args.patch_size,
        stride=args.stride,
        blend=args.blend,
        bands=args.bands,
        output_kind=args.output_kind,
        max_batch_patches=args.batch_size,
    )
    out = Path(args.output)
    items: list[Any] = [list(args.inputs)] if args.time_series else list(args.inputs)
    if len(items) == 1:
        target = out / f"{Path(args.inputs[0]).stem}_pred.tif" if out.is_dir() else out
        paths: list[Path | None] = [target]
    else:
        out.mkdir(parents=True, exist_ok=True)
        paths = engine._output_paths(items, out, "path", single=False)  # noqa: SLF001
    t0 = time.perf_counter()
    for item, path in zip(items, paths, strict=False):
        engine.add_request(item, output_path=path, request_id=str(path))
    failed = 0
    patches = 0
    for result in engine.run_until_done():
        patches += result.num_patches
        if result.error is not None:
            failed += 1
            if args.debug:
                traceback.print_exception(result.error)
            print(f"geoserve: error: {result.error}", file=sys.stderr)
        elif not args.quiet and isinstance(result, ImageRequestOutput):
            o = result.outputs
            assert o is not None
            print(
                f"wrote {o.path} ({o.width}x{o.height}, {o.count} band(s) {o.dtype}, "
                f"{result.num_patches} patches, {result.timings.total:.2f} s)"
            )
    if not args.quiet and len(items) > 1:
        dt = time.perf_counter() - t0
        print(
            f"{len(items) - failed} of {len(items)} inputs done, {failed} failed, "
            f"{patches} patches in {dt:.1f} s ({patches / max(dt, 1e-9):.1f} patches/s)"
        )
    return 1 if failed else 0


def _format_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> str:
    return f"geoserve: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="geoserve: %(levelname)s: %(message)s")
    if not args.debug:
        warnings.formatwarning = _format_warning
    try:
        if args.command == "models":
            return _cmd_models(args)
        return _cmd_predict(args)
    except GeoServeError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"geoserve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("geoserve: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        print(
            f"geoserve: unexpected error: {exc!r} (rerun with --debug for details)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
