"""Quicklook pictures: the input in true colour beside the prediction, as one PNG.

The input is shown as red/green/blue (band descriptions B4/B3/B2 or RED/GREEN/BLUE when the
file names its bands, Sentinel-2 stack positions for 13-band files, else the first three
bands), each stretched between its 2nd and 98th percentile. A class map is drawn with the
GeoTIFF's own colour table and a legend of its class names; float outputs (probabilities,
regression, reconstruction) with a colour bar. The caption gives the CRS and pixel size.
Large rasters are read decimated (at most ``max_side`` pixels on the long side).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from numpy.typing import NDArray
from rasterio.enums import Resampling

from geoserve.errors import OutputWriteError
from geoserve.raster.trust import open_allowed

_RGB_NAMES = (("B4", "B3", "B2"), ("RED", "GREEN", "BLUE"), ("B04", "B03", "B02"))


def _rgb_bands(ds: Any) -> list[int]:
    names = [(d or "").upper() for d in ds.descriptions]
    for triple in _RGB_NAMES:
        if all(n in names for n in triple):
            return [names.index(n) + 1 for n in triple]
    if ds.count == 13:  # Sentinel-2 L1C stack B1..B8, B8A, B9..B12
        return [4, 3, 2]
    return [1, 2, 3] if ds.count >= 3 else [1, 1, 1]


def _read(ds: Any, bands: list[int], max_side: int) -> np.ma.MaskedArray[Any, Any]:
    scale = max(ds.width, ds.height) / max_side
    shape = (
        len(bands),
        max(1, round(ds.height / max(scale, 1))),
        max(1, round(ds.width / max(scale, 1))),
    )
    data: np.ma.MaskedArray[Any, Any] = ds.read(
        bands, out_shape=shape, resampling=Resampling.nearest, masked=True
    )
    return data


def _stretch(rgb: np.ma.MaskedArray[Any, Any]) -> NDArray[np.float32]:
    out = np.zeros((*rgb.shape[1:], 4), dtype=np.float32)
    for i, band in enumerate(rgb.astype(np.float64)):
        values = band.compressed()
        lo, hi = np.percentile(values, (2, 98)) if values.size else (0.0, 1.0)
        out[..., i] = np.clip((band.filled(lo) - lo) / max(hi - lo, 1e-12), 0, 1)
    valid = ~np.ma.getmaskarray(rgb).any(axis=0)
    out[..., 3] = valid
    return out


def _caption(ds: Any) -> str:
    crs = ds.crs
    if crs is None:
        return "not georeferenced"
    epsg = crs.to_epsg()
    name = f"EPSG:{epsg}" if epsg else crs.to_string()[:40]
    unit = "°" if crs.is_geographic else " m"
    return f"{name}, pixel {abs(ds.transform.a):.4g}{unit} x {abs(ds.transform.e):.4g}{unit}"


def render_quicklook(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    *,
    max_side: int = 1024,
) -> Path:
    """Draw input and output side by side into ``png_path``.

    Raises:
        OutputWriteError: the PNG cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    with open_allowed(str(input_path)) as src:  # never by GDAL's sniffing
        rgb = _stretch(_read(src, _rgb_bands(src), max_side))
        caption = _caption(src)
    with rasterio.open(output_path) as out:
        pred = _read(out, [1], max_side)[0]
        names = out.tags().get("CLASS_NAMES", "").split(",")
        is_classes = (
            out.dtypes[0] in ("uint8", "uint16")
            and out.tags().get("GEOSERVE_OUTPUT", "classes") == "classes"
        )
        colormap = out.colormap(1) if is_classes and out.dtypes[0] == "uint8" else None
        label = out.descriptions[0] or "band 1"
    aspect = rgb.shape[0] / rgb.shape[1]  # the two panels share the input's shape
    fig, axes = plt.subplots(1, 2, figsize=(12, min(12.0, max(3.0, 6 * aspect)) + 1.0), dpi=100)
    axes[0].imshow(rgb, interpolation="nearest")
    axes[0].set_title(f"input (true colour): {Path(input_path).name}", fontsize=9)
    if is_classes:
        n = max(len(names), int(pred.max()) + 1 if pred.count() else 1)
        colors = [
            tuple(c / 255 for c in (colormap or {}).get(i, (128, 128, 128, 255))) for i in range(n)
        ]
        axes[1].imshow(
            np.ma.masked_greater_equal(pred, n),
            cmap=ListedColormap(colors),
            vmin=-0.5,
            vmax=n - 0.5,
            interpolation="nearest",
        )
        handles = [
            Patch(color=colors[i], label=names[i] if i < len(names) else f"class {i}")
            for i in range(n)
        ]
        axes[1].legend(handles=handles, loc="lower right", fontsize=8, framealpha=0.85)
    else:
        image = axes[1].imshow(pred, cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=axes[1], fraction=0.046, pad=0.04, label=label)
    axes[1].set_title(f"prediction: {Path(output_path).name}", fontsize=9)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle(caption, y=0.04, fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    png = Path(png_path)
    try:
        fig.savefig(png)
    except OSError as exc:
        raise OutputWriteError(f"{png}: cannot write quicklook ({exc})") from exc
    finally:
        plt.close(fig)
    return png
