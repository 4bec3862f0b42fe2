"""``geoserve info`` (a raster's layout, and whether it fits a model) and ``geoserve models``.

``info -i s2=S2.tif -i s1=S1.tif`` (or several files) describes the modalities of one request:
each one's grid, which grid the model sees (the reference) and how every other input is put
on it, with the share of the reference grid it covers (from the footprints; no pixels read).
"""

from __future__ import annotations

import argparse
import json
import shutil
from typing import Any

from geoserve.errors import ConfigError, GeoServeError


def cmd_models(args: argparse.Namespace) -> int:
    """``geoserve models``: the registered models, as a table or JSON.

    ``--server URL``: the models that server serves, as its ``GET /v1/models`` lists them.
    """
    if getattr(args, "server", None):
        return _server_models(args)
    from geoserve.catalog import footer_lines, format_table, model_entries
    from geoserve.cli.configured import register_configured_models

    register_configured_models(args)
    entries = model_entries()
    if args.json:
        print(json.dumps([e.as_json() for e in entries], indent=2))
    else:
        width = shutil.get_terminal_size((100, 24)).columns
        print("\n".join([*format_table(entries, width), *footer_lines(entries, width)]))
    return 0


def _server_models(args: argparse.Namespace) -> int:
    """``geoserve models --server URL``: one line per served model (``--json``: the entries)."""
    import os

    from geoserve.client import Client

    flags = (("--register", args.register), ("--models-dir", args.models_dir))
    local = [name for name, on in flags if on]
    if local:
        raise ConfigError(f"{', '.join(local)}: not with --server (it lists the server's models)")
    key = args.api_key or os.environ.get("GEOSERVE_API_KEY") or None
    with Client(args.server, key) as client:
        entries = client.models()
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    for entry in entries:  # (the server's text, shown printable only)
        output: dict[str, Any] = _mapping(entry.get("output"))
        kinds = output.get("kinds") if isinstance(output.get("kinds"), list) else []
        inp: dict[str, Any] = _mapping(entry.get("input"))
        bands = inp.get("bands") if isinstance(inp.get("bands"), list) else None
        state = entry.get("state")  # (a server before lazy loading gives only "ready")
        if state not in ("loaded", "loading", "unloaded", "failed"):
            state = "ready" if entry.get("ready") else "loading"
        elif state == "unloaded":
            state = "not loaded (loads on first use)"
        parts = [_shown(entry.get("id")), state]
        if kinds:
            parts.append("output " + ", ".join(_shown(k) for k in kinds))
        if bands:
            parts.append(f"{len(bands)} bands")
        if isinstance(inp.get("patch_size"), int):
            parts.append(f"patch {inp['patch_size']}")
        print("  ".join(parts))
    return 0


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _shown(value: Any) -> str:
    """A server's text as printed: printable characters only, at most 100."""
    return "".join(c for c in str(value) if c.isprintable())[:100]


def cmd_info(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """``geoserve info``: a raster's size, grid, bands and date; with --model, whether it fits.

    With ``-i`` or several files: the modalities of one request (:func:`_cmd_modalities`).
    """
    from geoserve.raster.coords import centre_lonlat
    from geoserve.raster.source import open_raster

    modalities: list[tuple[str, str]] = getattr(args, "modalities", None) or []
    inputs = list(args.inputs)
    if getattr(args, "stac", None) is not None:
        from geoserve.cli.parser import DEFAULT_MODEL
        from geoserve.cli.stac_search import search_of, show_search

        assert parser is not None
        search = search_of(args, parser)
        assert search is not None
        return show_search(search, args.model or DEFAULT_MODEL)
    if modalities and inputs or not (modalities or inputs):
        why = "give a file (IN), or modalities (-i NAME=SOURCE ...)"
        if modalities:
            name, source = modalities[0]
            why = f"give a file ({inputs[0]}) or modalities (-i {name}={source}), not both"
        if parser is None:
            raise SystemExit(f"geoserve: error: info: {why}")
        parser.error(f"info: {why}")
    if modalities or len(inputs) > 1:
        return _cmd_modalities(args)
    with open_raster(inputs[0]) as src:
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
        print(f"date:      {_date(info)}")
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
        takes = f"; it takes {spec.input_description}" if spec.input_description else ""
        print(f"fits {spec.name}: no: {exc}{takes}")
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


# -- several modalities ------------------------------------------------------------------------


def _cmd_modalities(args: argparse.Namespace) -> int:
    """Each input's grid, the reference grid, how each input is aligned; whether they fit."""
    from geoserve.cli.multimodal import reference_of, request_of, sources_of
    from geoserve.cli.parser import DEFAULT_MODEL
    from geoserve.engine import resolve_model
    from geoserve.errors import InputError, prefixed
    from geoserve.raster.align import TargetGrid
    from geoserve.raster.source import open_raster

    spec, in_proc, _ = resolve_model(args.model or DEFAULT_MODEL)
    declared = list(getattr(in_proc, "modalities", ()))
    pairs = list(args.modalities or ())
    if not pairs:  # files: the model's modalities in order (a plain model: input1, input2, ...)
        names = [m.name for m in declared] or [f"input{k + 1}" for k in range(len(args.inputs))]
        if len(args.inputs) > len(names):
            raise InputError(
                f"model {spec.name!r} takes the modalities {', '.join(names)}; got "
                f"{len(args.inputs)} files: name each with -i NAME=FILE"
            )
        pairs = list(zip(names, args.inputs, strict=False))
    request = request_of(pairs)
    if declared:
        words = ", ".join(
            f"{m.name} ({'required' if m.required else 'optional'})" for m in declared
        )
        print(f"model:     {spec.name}, modalities {words}")
    else:
        print(f"model:     {spec.name}, one band stack: the inputs' bands in the order given")
    opened: dict[str, list[Any]] = {}
    try:
        for name, source in sources_of(request):
            try:
                opened.setdefault(name, []).append(open_raster(source))
            except GeoServeError as exc:
                raise prefixed(exc, f"modality {name!r}") from None
        ref = reference_of(in_proc, list(request))
        first = opened[ref.name][0].info
        fixed = ref.crs is not None or ref.resolution is not None
        grid = (
            TargetGrid.covering(first, ref.crs, ref.resolution) if fixed else TargetGrid.of(first)
        )
        print(f"reference: {ref.label()} (the output's grid: {_grid_words(grid)})")
        for name, sources in opened.items():
            for k, src in enumerate(sources):
                label = name if len(sources) == 1 else f"{name} (date {k + 1} of {len(sources)})"
                _describe(label, src.info, grid, in_proc)
        for m in declared:
            if m.name not in opened and not m.required:
                print(f"\n{m.name}: not given (optional: absent from the model's input)")
        return _check_modalities(spec.name, in_proc, opened)
    finally:
        for sources in opened.values():
            for src in sources:
                src.close()


def _grid_words(grid: Any) -> str:
    from geoserve.cli.multimodal import crs_name, pixel_size

    size = f"{grid.width} x {grid.height} pixels"
    if grid.crs is None:
        return f"{size}, not georeferenced"
    return f"{size}, {crs_name(grid.crs)}, {pixel_size(grid.crs, grid.transform, grid.height)}"


def _describe(label: str, info: Any, grid: Any, in_proc: Any) -> None:
    """One input: its grid, data type, nodata, bands, date, and how it is aligned."""
    from rasterio.transform import array_bounds

    from geoserve.cli.multimodal import alignment, crs_name, pixel_size, resampling_of

    print(f"\n{label}: {info.name}")
    print(f"  size:    {info.width} x {info.height} pixels, {info.count} band(s) {info.dtype}")
    if info.is_georeferenced:
        west, south, east, north = array_bounds(info.height, info.width, info.transform)
        fmt = "{:.6f}" if info.crs.is_geographic else "{:.10g}"
        bounds = ", ".join(fmt.format(v) for v in (west, south, east, north))
        print(f"  crs:     {crs_name(info.crs)}")
        print(f"  pixel:   {pixel_size(info.crs, info.transform, info.height)}")
        print(f"  bounds:  {bounds} (west, south, east, north)")
    else:
        print("  crs:     none (not georeferenced)")
    print(f"  nodata:  {info.nodata if info.nodata is not None else 'none declared'}")
    print(f"  bands:   {', '.join(d or f'({i + 1})' for i, d in enumerate(info.descriptions))}")
    print(f"  date:    {_date(info)}")
    resampling = resampling_of(in_proc, label.split(" ")[0])
    print(f"  grid:    {alignment(info, grid, resampling)}")


def _check_modalities(model: str, in_proc: Any, opened: dict[str, list[Any]]) -> int:
    """Whether the model takes these modalities (planned as a request would be; no pixels)."""
    try:
        flat, ctx = in_proc.prepare_modalities(opened, threads=1)
    except GeoServeError as exc:
        print(f"\nfits {model}: no: {exc}")
        return 1
    for src in flat:  # the warpers (each closes its input too; closing twice is harmless)
        src.close()
    print(
        f"\nfits {model}: yes (bands {', '.join(ctx.band_names)}; "
        f"{len(ctx.grid)} patches of {ctx.grid.patch_size} px)"
    )
    return 0


def _date(info: Any) -> str:
    """An input's acquisition date as ``info`` prints it, or ``unknown``."""
    from geoserve.raster.coords import acquisition_date

    try:
        return acquisition_date(info).isoformat()
    except GeoServeError:
        return "unknown"
