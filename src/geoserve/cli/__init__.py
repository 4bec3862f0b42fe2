"""The ``geoserve`` command line: ``predict``, ``serve``, ``info``, ``models`` and more.

Exit codes: 0 success, 1 an input or model error (one line naming the file, band or model; a
traceback only with ``--debug``), 2 a usage error.

One module per job: :mod:`~geoserve.cli.parser` (the subcommands), :mod:`~geoserve.cli.options`
(flags generated from the configuration models, ``--config`` files),
:mod:`~geoserve.cli.predict`, :mod:`~geoserve.cli.serve`, :mod:`~geoserve.cli.inspect`
(``info`` and ``models``), :mod:`~geoserve.cli.accuracy` (``bench-accuracy``). Nothing here
imports torch until a model is about to load.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from geoserve.cli.parser import DEFAULT_MODEL, build_parser
from geoserve.errors import GeoServeError

__all__ = ["DEFAULT_MODEL", "build_parser", "main"]


def _format_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> str:
    return f"geoserve: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="geoserve: %(levelname)s: %(message)s")
    if args.debug:
        logging.getLogger("geoserve.plugins").setLevel(logging.DEBUG)  # a plugin's traceback
    else:
        warnings.formatwarning = _format_warning
    from rasterio.errors import NotGeoreferencedWarning

    # rasterio's own no-georeferencing warning: geoserve says it once per input, in its words
    # (the filters around single opens are not thread-safe across writer and commit threads)
    warnings.filterwarnings("ignore", category=NotGeoreferencedWarning)
    try:
        if args.command == "models":
            from geoserve.cli.inspect import cmd_models

            return cmd_models(args)
        if args.command == "info":
            from geoserve.cli.inspect import cmd_info

            return cmd_info(args, parser)
        if args.command == "bench-accuracy":
            from geoserve.cli.accuracy import cmd_bench_accuracy

            return cmd_bench_accuracy(args)
        if args.command == "serve":
            from geoserve.cli.serve import cmd_serve

            return cmd_serve(args)
        from geoserve.cli.predict import cmd_predict

        return cmd_predict(args, parser)
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
