"""Writing outputs as GeoTIFFs that line up pixel for pixel with the input.

The output profile is the input's profile with CRS, transform, width and height kept verbatim
and count, dtype, nodata, tiling and compression replaced. Files are written to a temporary name
in the target directory and renamed into place, so a failed or interrupted write never leaves a
partial file under the requested name. In-memory outputs go through rasterio's ``MemoryFile``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from affine import Affine
from numpy.typing import NDArray
from rasterio.errors import RasterioError
from rasterio.io import MemoryFile

from geoserve.errors import OutputWriteError

#: Internal tile size of written GeoTIFFs (a multiple of 16, as TIFF tiling requires).
BLOCK_SIZE = 256


@dataclass(frozen=True)
class OutputRaster:
    """A finished output: (bands, height, width) data plus what the GeoTIFF should carry."""

    data: NDArray[Any]
    nodata: float | None = None
    descriptions: Sequence[str] = ()
    colormap: Mapping[int, tuple[int, int, int, int]] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    categories: Sequence[str] = ()


def output_profile(source_profile: Mapping[str, Any], out: OutputRaster) -> dict[str, Any]:
    """The GeoTIFF profile for ``out``: the source's grid, the output's bands and encoding."""
    count, height, width = out.data.shape
    dtype = np.dtype(out.data.dtype)
    profile: dict[str, Any] = {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": count,
        "dtype": dtype.name,
        "nodata": out.nodata,
        "tiled": True,
        "blockxsize": BLOCK_SIZE,
        "blockysize": BLOCK_SIZE,
        "compress": "deflate",
        "predictor": 3 if dtype.kind == "f" else 2,
        "interleave": "band" if count > 1 else "pixel",
        "BIGTIFF": "IF_SAFER",
    }
    if source_profile.get("crs") is not None:
        profile["crs"] = source_profile["crs"]
    transform = source_profile.get("transform")
    if transform is not None and transform != Affine.identity():
        profile["transform"] = transform
    return profile


def _write(dst: Any, out: OutputRaster) -> None:
    dst.write(out.data)
    for i, desc in enumerate(out.descriptions, start=1):
        dst.set_band_description(i, desc)
    if out.colormap is not None:
        dst.write_colormap(1, dict(out.colormap))
    if out.tags:
        dst.update_tags(**out.tags)


def write_geotiff(
    path: str | os.PathLike[str], out: OutputRaster, source_profile: Mapping[str, Any]
) -> Path:
    """Write ``out`` to ``path`` atomically (temporary file in the same directory, then rename).

    Raises:
        OutputWriteError: naming the path, if the directory is missing or the write fails.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise OutputWriteError(f"{path}: output directory {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with rasterio.open(tmp, "w", **output_profile(source_profile, out)) as dst:
            _write(dst, out)
        if out.categories:
            _write_categories(path, out.categories)
        os.replace(tmp, path)
    except (RasterioError, OSError) as exc:
        raise OutputWriteError(f"{path}: cannot write output ({exc})") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write_categories(path: Path, names: Sequence[str]) -> None:
    """Class names for GIS tools, in GDAL's PAM sidecar (``<file>.aux.xml``).

    GeoTIFF has no place for category names; GDAL (and so QGIS) reads them from the sidecar.
    """
    from xml.sax.saxutils import escape

    items = "".join(f"<Category>{escape(n)}</Category>" for n in names)
    xml = (
        f'<PAMDataset><PAMRasterBand band="1"><CategoryNames>{items}</CategoryNames>'
        "</PAMRasterBand></PAMDataset>\n"
    )
    sidecar = path.with_name(path.name + ".aux.xml")
    tmp = sidecar.with_name(f".{sidecar.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(xml)
    os.replace(tmp, sidecar)


def geotiff_bytes(out: OutputRaster, source_profile: Mapping[str, Any]) -> bytes:
    """Encode ``out`` as GeoTIFF bytes in memory."""
    with MemoryFile() as mem:
        with mem.open(**output_profile(source_profile, out)) as dst:
            _write(dst, out)
        mem.seek(0)
        return bytes(mem.read())
