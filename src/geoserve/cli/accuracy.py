"""``geoserve bench-accuracy``: whether a faster setting changes the answer on your own scene.

Runs the model over one scene in float32 and with the speed options given (``--quantize
int8``, ``--dtype bf16``, ``--compile``) and prints class agreement, the largest output
difference and both runs' times (:func:`geoserve.accuracy.compare_settings`).
"""

from __future__ import annotations

import argparse
import json

from geoserve.cli.options import engine_config, known_keys, read_options
from geoserve.config import EngineConfig


def cmd_bench_accuracy(args: argparse.Namespace) -> int:
    """Print the comparison (``--json``: as JSON); 0 when it ran."""
    from geoserve.cli.predict import model_of

    from_file = read_options(args.config, known_keys(EngineConfig))
    config = engine_config(args, from_file)
    args.ray = False
    model = model_of(args, from_file.get("model"))
    if not args.json:
        print(f"running {model} on {args.input} twice (float32, then the candidate)…", flush=True)
    from geoserve.accuracy import compare_settings

    report = compare_settings(model, args.input, config, labels=args.labels)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0
