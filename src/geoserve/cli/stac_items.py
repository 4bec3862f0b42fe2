"""``geoserve predict --stac-item``: a STAC Item describing each request's outputs.

``--stac-item`` alone writes ``<output stem>.json`` beside each request's outputs
(``-o water.tif``: ``water.json``; several kinds to the stem ``out/lake``: ``out/lake.json``);
``--stac-item=PATH`` names the Item of a single request. Asset hrefs are the outputs' file
names relative to the Item, inputs are shown as they were given on the command line, and the
Item never replaces an input file (a STAC Item given as input, say).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoserve.errors import ConfigError, GeoServeError
from geoserve.schemas import ImageOutput, ImageRequestOutput


@dataclass(frozen=True)
class Planned:
    """Where one request's Item goes, and what it says the request was."""

    path: Path
    inputs: Any
    options: dict[str, Any]


def plan_items(
    value: str | None,
    items: Sequence[Any],
    paths: Sequence[Path | None],
    dates: Sequence[Any],
    seed: int = 0,
) -> dict[str, Planned]:
    """Request id (its output path) -> its Item's plan; empty without ``--stac-item``.

    ``seed``: every request's (``--seed``), named in its Item's options.

    Raises:
        ConfigError: ``PATH`` for several requests, a ``PATH`` not named ``.json``, or an Item
            that would replace one of the inputs.
    """
    if value is None:
        return {}
    from geoserve.engine.request_spec import RequestSpec
    from geoserve.stac_result import request_options

    plans = {}
    targets = item_targets(value, items, paths)
    for item, path, when in zip(items, paths, dates, strict=False):
        assert path is not None
        options = request_options(RequestSpec(item, dates=when, seed=seed))
        plans[str(path)] = Planned(targets[str(path)], given_inputs(item), options)
    return plans


def item_targets(
    value: str | None, items: Sequence[Any], paths: Sequence[Path | None]
) -> dict[str, Path]:
    """Request id (its output path) -> where its Item goes; empty without ``--stac-item``.

    Raises:
        ConfigError: as :func:`plan_items`.
    """
    if value is None:
        return {}
    if value and len(items) > 1:
        raise ConfigError(
            f"--stac-item={value}: one Item names one request, and there are {len(items)}; "
            "give --stac-item alone to write one beside each output"
        )
    if value and not value.lower().endswith(".json"):
        raise ConfigError(
            f"--stac-item {value}: the Item's file name must end in .json (write "
            "--stac-item=PATH; --stac-item alone writes it beside the outputs)"
        )
    targets = {}
    for item, path in zip(items, paths, strict=False):
        assert path is not None
        target = Path(value) if value else _beside(path)
        if target.absolute() == path.absolute():  # (-o out.json: a GeoJSON of polygons)
            raise ConfigError(
                f"--stac-item: the Item {target} would be the output itself; give --stac-item=PATH"
            )
        _check_not_an_input(target, given_inputs(item))
        targets[str(path)] = target
    return targets


class ItemWriter:
    """Writes the planned Items of finished requests (the model described once)."""

    def __init__(self, engine: Any, plans: dict[str, Planned], *, quiet: bool) -> None:
        from geoserve.stac_result import model_info

        self.plans, self.quiet = plans, quiet
        self.model = model_info(engine) if plans else None

    def __call__(self, result: ImageRequestOutput) -> int:
        """Write ``result``'s Item if one is planned; 1 if it could not be."""
        plan = self.plans.get(result.request_id)
        if plan is None or not result.ok or self.model is None:
            return 0  # (a failed request is reported, and counted, already)
        from geoserve.stac_result import result_item, write_item

        folder = plan.path.parent

        def href(kind: str, output: ImageOutput) -> str:
            assert output.path is not None
            return Path(os.path.relpath(output.path, folder)).as_posix()

        try:
            item = result_item(
                result,
                model=self.model,
                inputs=plan.inputs,
                options=plan.options,
                item_id=plan.path.stem,
                hrefs=href,
            )
            folder.mkdir(parents=True, exist_ok=True)
            write_item(item, plan.path)
        except OSError as exc:
            print(f"geoserve: error: {plan.path}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        except GeoServeError as exc:
            print(f"geoserve: error: {plan.path}: {exc}", file=sys.stderr)
            return 1
        if not self.quiet:
            print(f"wrote {plan.path} (STAC Item)")
        return 0


def _beside(path: Path) -> Path:
    """``<stem>.json`` for a request's output path (a file, or the stem of several kinds)."""
    from geoserve.raster.sinks import OUTPUT_SUFFIXES

    stem = path.with_suffix("") if path.suffix.lower() in OUTPUT_SUFFIXES else path
    return stem.with_name(f"{stem.name}.json")


def given_inputs(item: Any) -> Any:
    """A request's inputs as the command line gave them: a list, or modality -> list."""
    if isinstance(item, dict):
        return {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in item.items()}
    return [str(x) for x in (item if isinstance(item, list) else [item])]


def _check_not_an_input(target: Path, given: Any) -> None:
    names = [x for v in given.values() for x in v] if isinstance(given, dict) else given
    for name in names:
        try:
            same = target.exists() and os.path.samefile(target, name)
        except OSError:
            same = False
        if same:
            raise ConfigError(
                f"--stac-item: the Item {target} would replace the input {name}; give "
                "--stac-item=PATH or another -o"
            )
