"""Size guards a request passes before any pixel is read: patch count, memory, disk.

The server has its own admission bounds on top (queued patches, decoded pixels, the memory of
all admitted requests together; see :mod:`geoserve.engine.async_engine`); these are the ones
the Python API and the CLI apply too, so an enormous input is refused at once with a message
naming the limit and how to lift it, instead of running for hours or exhausting memory.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np

from geoserve.config import DEFAULT_MAX_PATCHES as DEFAULT_MAX_PATCHES
from geoserve.engine.request import Request
from geoserve.errors import GeoServeWarning, PayloadTooLargeError
from geoserve.raster.dataset import CHUNK_ROWS
from geoserve.schemas import TOKEN_KINDS

#: Token width assumed for a request's memory before the model has returned tokens (the widest
#: served encoder: Prithvi-EO-2.0-600M, 1280).
TOKEN_WIDTH_BOUND = 1280

#: Share of the machine's physical memory one request's estimate may take by default.
MEMORY_SHARE = 0.75
MB = 1024 * 1024


class DiskSpaceWarning(GeoServeWarning):
    """Issued when the output's file system may not have room for the output."""


def physical_memory() -> int | None:
    """Bytes of physical memory (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_max_memory() -> int | None:
    """:data:`MEMORY_SHARE` of physical memory."""
    total = physical_memory()
    return int(total * MEMORY_SHARE) if total else None


def check_request(req: Request, max_patches: int | None, max_memory: int | None) -> None:
    """Refuse a request over the patch or memory limit (``None``: no limit).

    Raises:
        PayloadTooLargeError: naming the input, its size and the limit.
    """
    info = req.sources[0].info
    n = len(req.ctx.grid)
    if max_patches is not None and n > max_patches:
        raise PayloadTooLargeError(
            f"{info.name}: {info.width}x{info.height} px makes {n} patches, over the limit of "
            f"{max_patches} (raise it with --max-patches, or max_patches= in Python)"
        )
    need = req.memory_bytes
    if max_memory is not None and need > max_memory:
        raise PayloadTooLargeError(
            f"{info.name}: streaming it would hold about {need // MB} MB (rows of "
            f"{req.ctx.grid.patch_size} px over its {info.width} px width, "
            f"{len(req.ctx.bands)} band(s) x {len(req.sources)} date(s)), over the limit of "
            f"{max_memory // MB} MB"
        )


def warn_if_disk_short(path: Path, req: Request) -> None:
    """Warn when the output's file system has less room than the uncompressed output.

    Compression usually makes outputs far smaller, so this only warns; a write that does run
    out of space fails the request with :class:`~geoserve.errors.OutputSpaceError`.
    """
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return
    g = req.ctx.grid
    channels = req.out_proc.out_channels or len(req.ctx.bands) * len(req.sources)
    size = 1 if getattr(req.out_proc, "kind", None) == "classes" else 4
    need = g.height * g.width * channels * size
    if free < need:
        warnings.warn(
            f"{path}: {free // MB} MB free on its file system, the output is up to "
            f"{need // MB} MB before compression",
            DiskSpaceWarning,
            stacklevel=3,
        )


def memory_estimate(req: Request) -> int:
    """Estimated peak memory of ``req`` while it streams, from its inputs' headers alone.

    What a request holds does not follow its pixel count but its *padded row*: every grid
    row is read ``patch_size`` rows tall over the whole width, so a 1-pixel-tall strip
    costs as much per row as a full scene of that width. Per request:

    - ``min(prefetch_rows + 2, grid rows)`` grid rows alive (read ahead, being cut,
      patches queued), each ``P x W' x bands x dates`` values held raw and as float32;
    - the source's row buffer of decoded rows (the chunks under one grid row, whole block
      rows and at least :data:`~geoserve.raster.dataset.CHUNK_ROWS` rows each, and one spare:
      ``(ceil(P / chunk) + 2) x chunk`` rows, at most ``2 H``), and the block GDAL decodes
      at once (a whole strip, every band of it when pixel-interleaved:
      :attr:`RasterInfo.block_bytes`);
    - the input bytes themselves, for uploads and base64 (:attr:`RasterInfo.held_bytes`);
    - for an input warped onto the grid, the warper's buffer: the input window one block
      of the grid covers (:meth:`RasterSource.warp_bytes`; all of a much finer input);
    - the canvas: ``min(P + S, H)`` rows of ``W`` float32 values per output channel, and
      the weights; for an embeddings kind, the token canvas too (the same rows on the
      token grid, ``D`` values per token, ``D`` taken as :data:`TOKEN_WIDTH_BOUND` until
      the model has said);
    - each output kind held whole in memory (bytes, base64, tensor): ``H x W`` values per
      output channel (1 byte for class maps, else 4), a third more as base64;

    with ``W' = cols x S + (P - S)`` the padded width. docs/serving.md states the formula.
    """
    g = req.ctx.grid
    p, s = g.patch_size, g.stride
    padded = g.cols * s + (p - s)
    values = req.ctx.input_values
    infos = [src.info for src in req.sources]
    raw = max(np.dtype(i.dtype).itemsize for i in infos)
    rows = min(req.prefetch_rows + 2, g.rows) * p * padded * values * (4 + raw)
    block_rows = max((i.block_bytes // max(1, i.width * raw) for i in infos), default=0)
    # the row buffer: the chunks under one grid row (whole block rows, at least CHUNK_ROWS
    # rows each: at most ceil(P / chunk) + 1 of them) and one spare chunk to decode into
    chunk = -(-CHUNK_ROWS // max(block_rows, 1)) * max(block_rows, 1)
    cache = min((-(-p // chunk) + 2) * chunk, 2 * g.height) * g.width * values * raw
    cache += sum(i.block_bytes + i.held_bytes for i in infos)
    channels = req.out_proc.out_channels or values
    canvas = min(p + s, g.height) * g.width * (channels + 1) * 4
    cache += sum(src.warp_bytes(bands) for src, bands in req.reads())
    if req.token_size:  # the token canvas, D channels over the token grid's rows
        t, d = req.token_size, req.token_channels or TOKEN_WIDTH_BOUND
        canvas += -(-min(p + s, g.height) // t) * -(-g.width // t) * (d + 1) * 4
    whole = 0
    if req.out_format != "path":
        for product in req.products():
            kind = getattr(product.proc, "kind", None)
            size = 1 if kind in ("classes", "polygons") else 4
            n = 1 if kind in ("classes", "polygons", "confidence") else channels
            pixels = g.height * g.width
            if kind in TOKEN_KINDS:  # D values per token (per patch: few)
                t, n = req.token_size or 1, req.token_channels or TOKEN_WIDTH_BOUND
                pixels = -(-g.height // t) * -(-g.width // t)
            whole += pixels * n * size * (7 if req.out_format == "b64" else 3)
        whole //= 3
    return rows + cache + canvas + whole
