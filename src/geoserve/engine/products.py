"""A request's output kinds: which a model offers, their processors, their sinks.

One request may ask for several kinds (``classes``, ``confidence``, ``polygons``,
``embeddings`` ...) from one model pass; each becomes a :class:`Product`, its own output
processor and sink, fed the same stitched rows (the token kinds: the encoder's tokens of the
same forward pass, see :mod:`geoserve.processors.embeddings`). The kinds a model offers are its
output processor's ``kinds`` and, for a model registered with a ``token_size``, the token
kinds; asking for another is a :class:`~geoserve.errors.ConfigError` naming what it offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoserve.config import EngineConfig
from geoserve.errors import ConfigError
from geoserve.processors.base import OutputProcessor, RasterContext
from geoserve.processors.embeddings import EmbeddingReassembler, token_profile
from geoserve.raster.patch_embeddings import PatchEmbeddingSink
from geoserve.raster.polygons import PolygonSink
from geoserve.raster.sinks import POLYGON_SUFFIXES, OutputSink, make_sink
from geoserve.registry import ModelSpec
from geoserve.schemas import OUTPUT_KINDS, TOKEN_KINDS, VECTOR_KINDS, OutFormat


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
        ConfigError: a vector kind asked for as a tensor, or named with a raster suffix.
        OutputWriteError: the output directory does not exist.
    """
    grid = ctx.grid
    kind = getattr(out_proc, "kind", None)
    if path is not None and kind not in VECTOR_KINDS and path.suffix.lower() in POLYGON_SUFFIXES:
        raise ConfigError(
            f"{path}: {kind} is a GeoTIFF; name it .tif (a {path.suffix} file would hold a "
            "GeoTIFF under another format's name)"
        )
    if kind in VECTOR_KINDS and out_format == "tensor":
        raise ConfigError(
            f"{kind} are a vector file: ask for them as a path, bytes or base64, not a tensor"
        )
    if kind == "embeddings" and spec.token_size:
        profile = token_profile(ctx.profile, grid, spec.token_size)
        height, width = profile["height"], profile["width"]
        return make_sink(out_format, path, profile, height, width, cog=config.cog)
    if kind == "patch-embeddings":
        return PatchEmbeddingSink(path, ctx.profile, grid.height, grid.width)
    if kind == "polygons":
        names = getattr(out_proc, "classes", ())
        return PolygonSink(
            path, ctx.profile, grid.height, grid.width, class_names=names, min_area=config.min_area
        )
    return make_sink(out_format, path, ctx.profile, grid.height, grid.width, cog=config.cog)
