"""``geoserve info`` (a raster's layout, and whether it fits a model) and ``geoserve models``."""

from __future__ import annotations

import argparse
import json
import shutil
from typing import Any

from geoserve.errors import GeoServeError


def cmd_models(args: argparse.Namespace) -> int:
    """``geoserve models``: the registered models, as a table or JSON."""
    from geoserve.catalog import format_table, model_entries

    entries = model_entries()
    if args.json:
        print(json.dumps([e.as_json() for e in entries], indent=2))
    else:
        print("\n".join(format_table(entries, shutil.get_terminal_size((100, 24)).columns)))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``geoserve info``: a raster's size, grid, bands and date; with --model, whether it fits."""
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
