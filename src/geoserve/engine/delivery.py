"""Handing a finished output raster over in the form the request asked for, and naming files.

``path`` writes a GeoTIFF atomically; ``tensor`` returns the (bands, H, W) array as a torch
tensor; ``b64`` and ``bytes`` encode the GeoTIFF in memory.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geoserve.raster.write import OutputRaster, geotiff_bytes, write_geotiff
from geoserve.schemas import ImageOutput, OutFormat


def deliver(
    raster: OutputRaster, profile: Mapping[str, Any], out_format: OutFormat, path: Path
) -> ImageOutput:
    """Package ``raster`` as ``out_format`` (``path`` is used only for ``"path"``).

    Raises:
        OutputWriteError: the file cannot be written.
    """
    count, height, width = raster.data.shape
    out = ImageOutput(out_format, width, height, count, str(raster.data.dtype))
    if out_format == "path":
        out.path = write_geotiff(path, raster, profile)
    elif out_format == "tensor":
        out.tensor = torch.from_numpy(np.ascontiguousarray(raster.data))
    elif out_format == "b64":
        out.b64 = base64.b64encode(geotiff_bytes(raster, profile)).decode("ascii")
    else:
        out.data = geotiff_bytes(raster, profile)
    return out


def output_paths(items: Sequence[Any], directory: str | os.PathLike[str]) -> list[Path]:
    """One ``<stem>_pred.tif`` per input in ``directory`` (created), unique per stem.

    An item that is a list (dates of one place) is named after its first date; inputs without
    a file name (bytes, arrays) become ``input_<i>``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    seen: dict[str, int] = {}
    paths = []
    for i, item in enumerate(items):
        first = item[0] if isinstance(item, list | tuple) else item
        stem = Path(str(first)).stem if isinstance(first, str | os.PathLike) else f"input_{i}"
        n = seen.get(stem, 0)
        seen[stem] = n + 1
        paths.append(directory / (f"{stem}_pred.tif" if n == 0 else f"{stem}_{n}_pred.tif"))
    return paths
