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

from geoserve.config import DEFAULT_MAX_PATCHES as DEFAULT_MAX_PATCHES
from geoserve.engine.request import Request
from geoserve.errors import GeoServeWarning, PayloadTooLargeError

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
