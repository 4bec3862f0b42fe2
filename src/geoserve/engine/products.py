"""A request's output kinds: which a model offers, their processors, their sinks, their commit.

One request may ask for several kinds (``classes``, ``confidence``, ``polygons``,
``embeddings`` ...) from one model pass; each becomes a :class:`Product`, its own output
processor and sink, fed the same stitched rows (the token kinds: the encoder's tokens of the
same forward pass, see :mod:`geoserve.processors.embeddings`). The kinds a model offers are its
output processor's ``kinds`` and, for a model registered with a ``token_size``, the token
kinds; asking for another is a :class:`~geoserve.errors.ConfigError` naming what it offers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoserve.config import EngineConfig
from geoserve.errors import ConfigError, RequestAbortedError
from geoserve.processors.base import OutputProcessor, RasterContext
from geoserve.processors.embeddings import EmbeddingReassembler, token_profile
from geoserve.raster import tempfiles
from geoserve.raster.patch_embeddings import PatchEmbeddingSink
from geoserve.raster.polygons import PolygonSink, vertex_budget
from geoserve.raster.sinks import OutputSink, check_geotiff_name, make_sink
from geoserve.registry import ModelSpec
from geoserve.schemas import OUTPUT_KINDS, TOKEN_KINDS, VECTOR_KINDS, ImageOutput, OutFormat


@dataclass
class Product:
    """One output kind of a request: its output processor and its sink."""

    kind: str
    proc: OutputProcessor
    sink: OutputSink


def kinds_offered(spec: ModelSpec, out_proc: OutputProcessor) -> tuple[str, ...]:
    """Every output kind the model can produce.

    Its output processor's, then the token kinds when it is registered with a ``token_size``.
    """
    kinds = getattr(out_proc, "kinds", None) or (out_proc.kind,)
    own = tuple(k for k in kinds if k not in TOKEN_KINDS)
    return own + (TOKEN_KINDS if spec.token_size else ())


def output_processors(
    spec: ModelSpec,
    out_proc: OutputProcessor,
    kinds: str | Sequence[str],
    config: EngineConfig,
    model: Any = None,
) -> tuple[OutputProcessor, ...]:
    """The output processor of each of ``kinds`` (text: comma-separated), in order.

    ``model``: the built module, when there is one yet (a token kind needs its
    ``forward_with_tokens``).

    Raises:
        ConfigError: an unknown kind, a kind this model cannot produce (naming the ones it
            can), a kind asked twice, or no kind.
    """
    names = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else list(kinds)
    if not names:
        raise ConfigError("output_kind: give at least one kind")
    twice = sorted({k for k in names if names.count(k) > 1})
    if twice:
        raise ConfigError(f"output_kind: {', '.join(twice)} asked for more than once")
    offered = kinds_offered(spec, out_proc)
    procs: list[OutputProcessor] = []
    for kind in names:
        if kind not in OUTPUT_KINDS:
            raise ConfigError(
                f"invalid output kind {kind!r}; choose one of {', '.join(OUTPUT_KINDS)}"
            )
        if kind not in offered:
            raise ConfigError(
                f"model {spec.name!r} cannot produce {kind!r} output; it offers "
                f"{', '.join(offered)}"
            )
        if kind in TOKEN_KINDS:
            if model is not None and not callable(getattr(model, "forward_with_tokens", None)):
                raise ConfigError(
                    f"model {spec.name!r} is registered with token_size but its module has "
                    "no forward_with_tokens (see geoserve.processors.embeddings)"
                )
            layer, dtype = config.embedding_layer, config.embedding_dtype
            procs.append(EmbeddingReassembler(kind, layer, dtype))  # type: ignore[arg-type]
            continue
        try:
            procs.append(out_proc.for_kind(kind))
        except ConfigError as exc:
            raise ConfigError(f"model {spec.name!r}: {exc}") from None
    return tuple(procs)


def product_sink(
    spec: ModelSpec,
    config: EngineConfig,
    out_proc: OutputProcessor,
    out_format: OutFormat,
    path: Path | None,
    ctx: RasterContext,
) -> OutputSink:
    """The sink of one output kind.

    A GeoTIFF (on the token grid for ``embeddings``), or a vector file for ``polygons`` and
    ``patch-embeddings``.

    Raises:
        ConfigError: a vector kind asked for as a tensor or xarray, or a GeoTIFF named with
            another format's suffix.
        OutputWriteError: the output directory does not exist.
    """
    grid = ctx.grid
    kind = getattr(out_proc, "kind", None)
    if path is not None and kind not in VECTOR_KINDS:
        check_geotiff_name(path, str(kind or "the output"))
    if kind in VECTOR_KINDS and out_format in ("tensor", "xarray"):
        raise ConfigError(
            f"{kind} are a vector file: ask for them as a path, bytes or base64, not "
            f"{'a tensor' if out_format == 'tensor' else 'xarray'}"
        )
    if kind == "embeddings" and spec.token_size:
        profile = token_profile(ctx.profile, grid, spec.token_size)
        height, width = profile["height"], profile["width"]
        return make_sink(
            out_format, path, profile, height, width, cog=config.cog, codec=config.codec
        )
    if kind == "patch-embeddings":
        return PatchEmbeddingSink(path, ctx.profile, grid.height, grid.width)
    if kind == "polygons":
        names = getattr(out_proc, "classes", ())
        budget = vertex_budget(grid.height * grid.width, config.max_polygon_vertices_per_pixel)
        return PolygonSink(
            path,
            ctx.profile,
            grid.height,
            grid.width,
            class_names=names,
            fmt=None if path is not None else config.polygon_format,  # (a name's suffix wins)
            min_area=config.min_area,
            max_vertices=budget,
        )
    return make_sink(
        out_format, path, ctx.profile, grid.height, grid.width, cog=config.cog, codec=config.codec
    )


def commit_all(products: list[Product], out_format: OutFormat) -> dict[str, ImageOutput]:
    """Finish every output kind of a request; by kind, in order.

    All or nothing: when one cannot be finished, the ones already finished are removed
    again and any files they replaced put back (the request's close drops the rest). A
    request aborted meanwhile (its sinks' ``cancelled`` set) stops before its next kind, and a
    polygons kind at its next polygon.

    Raises:
        OutputWriteError: naming the output that could not be finished.
        OutputTooComplexError: a vector kind over its cost bound.
        RequestAbortedError: the request was aborted.
    """
    kept: list[tuple[Path, Path]] = []  # (a file an output will replace, where it waits)
    if len(products) > 1:  # a later kind may fail: keep what the earlier ones replace
        for product in products:
            target = product.sink.target
            for path in (target, *([_sidecar(target)] if target else [])):
                if path is not None and path.is_file():
                    aside = tempfiles.new_temporary(path)
                    os.replace(path, aside)
                    kept.append((path, aside))
    done: dict[str, ImageOutput] = {}
    try:
        for product in products:
            cancelled = product.sink.cancelled
            if cancelled is not None and cancelled.is_set():
                raise RequestAbortedError(f"{product.kind}: the request was aborted")
            out = product.sink.commit(out_format)
            out.kind = product.kind
            done[product.kind] = out
    except BaseException:
        discard(done)
        for path, aside in kept:  # what was there before
            with contextlib.suppress(OSError):
                os.replace(aside, path)
            tempfiles.release(aside, remove=False)
        raise
    for _, aside in kept:
        tempfiles.release(aside, remove=True)
    return done


def discard(by_kind: dict[str, ImageOutput]) -> None:
    """Remove committed outputs again (their files, and a class map's sidecar)."""
    for out in by_kind.values():
        if out.path is not None:
            for path in (out.path, _sidecar(out.path)):
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)


def _sidecar(path: Path) -> Path:
    """A class map's ``.aux.xml`` sidecar (its category names)."""
    return path.with_name(path.name + ".aux.xml")
