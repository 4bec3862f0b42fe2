"""``--stac URL``: a STAC API search as the input of ``geoserve predict`` and ``geoserve info``.

``predict --stac URL --collection C --bbox W,S,E,N [--datetime A/B] [--max-cloud N]
[--resolution R] [--crs EPSG:N]`` runs the model on what the search finds (one request; see
docs/stac.md, "Searching a catalogue"); ``info --stac ...`` shows the Items found, the days
and bands that would be read and the output grid, reading no pixels.
"""

from __future__ import annotations

import argparse

from geoserve.stac_query import (
    MAX_SEARCH_ITEMS,
    StacSearch,
    describe_where,
    item_cloud,
    parse_bbox,
)


def add_stac_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """The search's flags, in a group of their own."""
    g = parser.add_argument_group(f"a STAC API search as the input ({what}; docs/stac.md)")
    g.add_argument("--stac", metavar="URL", help="the STAC API's root URL (needs geoserve[stac])")
    g.add_argument(
        "--collection",
        action="append",
        metavar="ID",
        help="a collection to search (repeat for several)",
    )
    g.add_argument("--bbox", metavar="W,S,E,N", help="the area, in degrees (WGS 84)")
    g.add_argument(
        "--datetime",
        metavar="A/B",
        help="the dates searched, as STAC APIs take them (2024-06-01/2024-08-31, 2024-06)",
    )
    g.add_argument(
        "--max-cloud", type=float, metavar="PCT", help="leave out Items above this eo:cloud_cover"
    )
    g.add_argument(
        "--resolution",
        type=float,
        metavar="R",
        help="the output's pixel size in its CRS's units (default: the finest band read)",
    )
    g.add_argument(
        "--crs", metavar="EPSG:N", help="the output's CRS (default: the UTM zone of the bbox)"
    )
    g.add_argument(
        "--max-items",
        type=int,
        default=MAX_SEARCH_ITEMS,
        metavar="N",
        help=f"refuse a search matching more Items (default and most: {MAX_SEARCH_ITEMS})",
    )


def search_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> StacSearch | None:
    """The search the flags give, or None without ``--stac`` (usage errors through ``parser``)."""
    flags = ("collection", "bbox", "datetime", "max_cloud", "resolution", "crs")
    if args.stac is None:
        given = [f for f in flags if getattr(args, f) is not None]
        if given:
            parser.error(f"--{given[0].replace('_', '-')} is for a search: give --stac URL too")
        return None
    if getattr(args, "inputs", None) or getattr(args, "modalities", None):
        parser.error("give input files or --stac URL, not both")
    if getattr(args, "time_series", False) or getattr(args, "ray", False):
        parser.error("--stac is one request: without --time-series or --ray")
    if getattr(args, "dates", None) is not None:
        parser.error("--dates: a search's dates are the days it reads (see geoserve info --stac)")
    if not args.collection or args.bbox is None:
        parser.error("--stac needs --collection ID and --bbox W,S,E,N")
    return StacSearch(
        args.stac,
        tuple(args.collection),
        parse_bbox(args.bbox),
        args.datetime,
        args.max_cloud,
        args.resolution,
        args.crs,
        args.max_items,
    )


def show_search(search: StacSearch, model: str) -> int:
    """``geoserve info --stac``: what the search finds and what ``model`` would read of it."""
    from geoserve.engine import resolve_model
    from geoserve.engine.stac_inputs import stac_processor
    from geoserve.raster.stac_mosaic import CLOUD_CLASSES, plan_search

    proc = stac_processor(resolve_model(model)[1], [search], "auto")  # type: ignore[list-item]
    frames = max(1, proc.num_frames)
    found = plan_search(search, proc.band_selectors(), frames)
    print(f"{search.name}: {len(found.items)} Items in {describe_where(search)}")
    for item in found.items:
        when = item.datetime.isoformat() if item.datetime else "no datetime"
        print(f"  {item.id}  {when}  cloud {item_cloud(item):g}%")
    days = "composite of" if frames == 1 else f"{frames} dates,"
    print(f"model {model!r} reads {days} {len(found.days)} day(s), clearest first:" if frames == 1
          else f"model {model!r} reads {days} one per window:")  # fmt: skip
    for day, items in found.days:
        print(f"  {day.isoformat()}: {', '.join(i.id for i in items)}")
    bands = ", ".join(f"{label} <- asset {key!r}" for label, key in found.assets.items())
    print(f"bands: {bands}")
    if "scl" in found.assets:
        print(f"clouds: scl classes {', '.join(map(str, CLOUD_CLASSES))} are nodata")
    rows, cols = found.shape
    print(f"grid: {cols} x {rows} pixels of {found.resolution:g} in {found.crs}")
    return 0
