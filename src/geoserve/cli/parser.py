"""The argument parser of ``geoserve``: its subcommands and their flags.

Engine flags are not written here: :func:`geoserve.cli.options.add_model_flags` generates them
from :class:`~geoserve.config.EngineConfig` (and ``serve``'s from
:class:`~geoserve.server.settings.ServerFields`), so a new option reaches the command line,
``--config`` files, the server and Ray by being declared once.
"""

from __future__ import annotations

import argparse
from typing import Any

from geoserve.cli.configured import add_configured_flags
from geoserve.cli.multimodal import modality_input
from geoserve.cli.options import add_model_flags
from geoserve.cli.stac_search import add_stac_flags
from geoserve.config import EngineConfig
from geoserve.seeds import SEED_RANGE, is_seed

DEFAULT_MODEL = "demo-water"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give {SEED_RANGE}") from None
    if not is_seed(value):
        raise argparse.ArgumentTypeError(f"{value}: give {SEED_RANGE}")
    return value


class _ModelName(argparse.Action):
    """``--model NAME``: the last one given is ``model``; every one, in order, ``model_list``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        namespace.model = values
        namespace.model_list = [*(getattr(namespace, "model_list", None) or []), values]


def _model_options() -> argparse.ArgumentParser:
    """Options shared by ``predict`` and ``serve``: the model, ``--config``, every engine knob."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-m",
        "--model",
        action=_ModelName,
        default=argparse.SUPPRESS,
        help=f"registered model name (default: {DEFAULT_MODEL}; see `geoserve models`); "
        "serve: repeat it to serve several models side by side, '*' for every model that "
        "needs no weights file (docs/serving.md)",
    )
    common.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON file of options (keys: the long flags' names with underscores, "
        "e.g. max_batch_patches: 32; see docs/configuration.md); flags override it",
    )
    engine = common.add_argument_group(
        "engine options (geoserve.EngineConfig; each also a key of --config FILE; "
        "see docs/performance.md for the speed ones)"
    )
    add_model_flags(engine, EngineConfig)
    return common


def _debug(parser: argparse.ArgumentParser) -> None:
    """``--debug`` is accepted after the subcommand too (hidden there)."""
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )


def _modality_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``-i NAME=SOURCE``, repeatable: the modalities of one request (not with IN)."""
    parser.add_argument(
        "-i",
        "--input",
        dest="modalities",
        action="append",
        type=modality_input,
        metavar="NAME=SOURCE",
        help=f"a modality and its file (s2=S2.tif), repeatable: all -i form {what}, in the "
        "order given; a NAME given again adds a date of it; not with IN",
    )


class _RayAddress(argparse.Action):
    """``--ray-address ADDRESS``: the cluster to join, and so ``--ray`` too."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        namespace.ray, namespace.ray_address = True, values


def _ray_flags(group: Any, what: str) -> None:
    """``--ray`` and ``--ray-address ADDRESS``, declared once for ``predict`` and ``serve``.

    ``--ray`` is a switch: it never takes the next word (an input pattern, say) for a value.
    """
    group.add_argument(
        "--ray", action="store_true", help=f"{what}; a local cluster unless --ray-address"
    )
    group.add_argument(
        "--ray-address",
        action=_RayAddress,
        metavar="ADDRESS",
        help="the Ray cluster to join: 'auto' (one running here), ray://HOST:10001 or "
        "HOST:6379; implies --ray (default: start a local one)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="geoserve", description="Serve image-to-image geospatial models on GeoTIFFs."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    common = _model_options()

    p = sub.add_parser("predict", parents=[common], help="run a model on GeoTIFFs, write GeoTIFFs")
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="IN",
        help="input GeoTIFF(s), each a request of its own (see --time-series); or use -i",
    )
    _modality_flag(p, "one request (one output)")
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output file (one input) or directory (several inputs); default: --output-dir",
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
        "dates (2020-06-01,2020-07-01); with -i, NAME=DATE per date of the modalities "
        "named (s2=2020-06-01,s1=2020-06-03); they win over date tags and file-name stamps",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=0,
        metavar="N",
        help="the seed of a generative model's random draws, for every request of the run "
        "(0 to 2**63 - 1; default 0): the same seed and inputs give the same output; "
        "one-pass models ignore it",
    )
    ray = p.add_argument_group("Ray (needs geoserve[ray]; see docs/scaling.md)")
    _ray_flags(ray, "run the scenes on a Ray cluster (-o is a directory)")
    ray.add_argument(
        "--ray-actors",
        type=_positive,
        default=2,
        metavar="N",
        help="engines running at once on Ray (default 2)",
    )
    ray.add_argument(
        "--cpus-per-actor",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs reserved per Ray actor (default 1)",
    )
    ray.add_argument(
        "--gpus-per-actor",
        type=float,
        default=0.0,
        metavar="N",
        help="GPUs per Ray actor (default 0; 1 = one engine per GPU)",
    )
    remote = p.add_argument_group(
        "a geoserve server (see docs/serving.md, Jobs); the model and its engine options are "
        "the server's"
    )
    remote.add_argument(
        "--server",
        metavar="URL",
        help="run the requests on this server as jobs (http://HOST:PORT): the inputs are "
        "uploaded, the outputs downloaded to where a local run writes them",
    )
    remote.add_argument(
        "--api-key",
        metavar="KEY",
        help="the server's API key (default: the GEOSERVE_API_KEY environment variable)",
    )
    p.add_argument(
        "--quicklook",
        metavar="PNG",
        help="also draw input and prediction side by side (a directory for several inputs)",
    )
    p.add_argument(
        "--stac-item",
        nargs="?",
        const="",
        metavar="PATH",
        help="also write a STAC Item describing each request's outputs: <output stem>.json "
        "beside them, or --stac-item=PATH for a single input (docs/outputs.md)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    add_stac_flags(p, "one request, instead of IN files")
    add_configured_flags(p, config_file=True)
    _debug(p)

    s = sub.add_parser(
        "serve", parents=[common], help="serve a model over HTTP (needs geoserve[server])"
    )
    server = s.add_argument_group("server options (also keys of --config FILE; docs/serving.md)")
    from geoserve.server.settings import ServerFields  # no web framework: just the fields

    add_model_flags(server, ServerFields)
    ray = s.add_argument_group("Ray Serve (needs geoserve[ray]; see docs/scaling.md)")
    _ray_flags(ray, "serve replicas on Ray Serve")
    ray.add_argument(
        "--replicas",
        type=_positive,
        default=2,
        metavar="N",
        help="Ray Serve replicas, each with its own engine (default 2)",
    )
    ray.add_argument(
        "--gpus-per-replica",
        type=float,
        default=0.0,
        metavar="N",
        help="GPUs per replica (default 0)",
    )
    add_configured_flags(s, config_file=True, models_dir=False)  # models_dir: a server field
    _debug(s)

    i = sub.add_parser(
        "info",
        help="describe a raster; with --model, whether it fits; with -i, how modalities align",
    )
    i.add_argument(
        "inputs",
        nargs="*",
        metavar="IN",
        help="a GeoTIFF; several: the modalities of one request, named as the model names "
        "them (as -i does)",
    )
    _modality_flag(i, "one request: each one's grid, and how the model's grid takes it")
    add_stac_flags(i, "the Items found and what the model would read; no pixels")
    i.add_argument(
        "-m",
        "--model",
        help="check the file against this model's needs (with -i or several files: the "
        f"model whose grid they are put on; default {DEFAULT_MODEL})",
    )
    _debug(i)

    b = sub.add_parser(
        "bench-accuracy",
        parents=[common],
        help="compare a faster setting (--quantize int8, --dtype bf16, --compile) with float32 "
        "on your own scene",
    )
    b.add_argument("input", metavar="IN", help="the scene (a GeoTIFF the model takes)")
    b.add_argument(
        "--labels",
        metavar="LABELS.tif",
        help="class labels on the scene's grid (negative or nodata: ignored): IoU of both runs",
    )
    b.add_argument("--json", action="store_true", help="the report as JSON")
    add_configured_flags(b, config_file=True)
    _debug(b)

    m = sub.add_parser("models", help="list registered models (or a server's: --server URL)")
    m.add_argument("--json", action="store_true", help="every detail, as JSON (for scripts)")
    m.add_argument(
        "--server", metavar="URL", help="list the models this geoserve server serves instead"
    )
    m.add_argument(
        "--api-key",
        metavar="KEY",
        help="the server's API key (default: the GEOSERVE_API_KEY environment variable)",
    )
    add_configured_flags(m)
    _debug(m)
    return parser
