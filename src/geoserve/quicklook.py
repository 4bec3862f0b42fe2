"""Quicklook pictures: the input beside the prediction, as one PNG (drawn with matplotlib).

The input is drawn as red/green/blue, each band stretched between its 2nd and 98th
percentile; which bands: :mod:`geoserve.raster.true_colour` (the map tiles choose the same).

The panel title says which bands are shown. A class map is drawn with the GeoTIFF's own colour
table and a legend of its class names; float outputs (probabilities, regression,
reconstruction) with a colour bar beside the panel, which keeps the panel the size of the
other. The caption gives the CRS and pixel size. Both rasters are read at the picture's size
(at most ``max_side`` pixels on the long side) with :func:`geoserve.raster.thumbnail.
read_thumbnail`, which decodes each block of the file at most once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from geoserve.errors import GeoServeError, OutputWriteError
from geoserve.raster.source import DataFormat, RasterInfo, RasterSource, open_raster
from geoserve.raster.thumbnail import read_thumbnail
from geoserve.raster.true_colour import choose_bands, stretch_limits
from geoserve.raster.trust import ALLOWABLE_INPUT_FORMATS


def model_band_roles(in_proc: Any, path: str | os.PathLike[str]) -> dict[int, str]:
    """What ``in_proc`` says the bands of the file at ``path`` are: 0-based index -> role.

    See :meth:`~geoserve.processors.InputProcessor.band_roles_for`; empty when it says
    nothing or the file does not fit it.
    """
    if in_proc is None:
        return {}
    try:
        with _opened(path) as src:
            return dict(in_proc.band_roles_for(src.info))
    except GeoServeError:
        return {}


def _stretch(bands: np.ma.MaskedArray[Any, Any]) -> NDArray[np.float32]:
    """(rows, cols, 4) RGBA: each band between its 2nd and 98th percentile; one band is grey."""
    out = np.zeros((*bands.shape[1:], 4), dtype=np.float32)
    for i, (band, (lo, hi)) in enumerate(
        zip(bands.astype(np.float64), stretch_limits(bands), strict=True)
    ):
        out[..., i] = np.clip((band.filled(lo) - lo) / max(hi - lo, 1e-12), 0, 1)
    if bands.shape[0] == 1:
        out[..., 1] = out[..., 2] = out[..., 0]
    out[..., 3] = ~np.ma.getmaskarray(bands).any(axis=0)
    return out


def _caption(info: RasterInfo) -> str:
    crs = info.crs
    if crs is None:
        return "not georeferenced"
    epsg = crs.to_epsg()
    name = f"EPSG:{epsg}" if epsg else crs.to_string()[:40]
    unit = "°" if crs.is_geographic else " m"
    return f"{name}, pixel {abs(info.transform.a):.4g}{unit} x {abs(info.transform.e):.4g}{unit}"


def _opened(path: str | os.PathLike[str], data_format: DataFormat = "auto") -> RasterSource:
    """A raster the engine already accepted (a file, an input's URL), opened again.

    Through the trust rules, as every input is.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the engine already warned about this file
        return open_raster(path, data_format, formats=ALLOWABLE_INPUT_FORMATS)


def _pyplot() -> Any:
    """Matplotlib's pyplot on the file-only Agg backend (its import takes about a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def preload() -> None:
    """Import matplotlib ahead of the first quicklook (the CLI does it while the model runs)."""
    _pyplot()


def render_quicklook(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    *,
    roles: Mapping[int, str] | None = None,
    max_side: int = 1024,
) -> Path:
    """Draw input and output side by side into ``png_path``.

    ``roles``: what the model says the input's bands are, by 0-based index (see
    :func:`choose_bands`).

    Raises:
        OutputWriteError: the PNG cannot be written.
    """
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    with _opened(input_path) as src:  # never by GDAL's sniffing
        bands, shown = choose_bands(src.info, roles)
        rgb = _stretch(read_thumbnail(src, bands, max_side))
        caption = _caption(src.info)
    with _opened(output_path, "path") as out:
        pred = read_thumbnail(out, [0], max_side)[0]
    info = out.info
    names = info.tags.get("CLASS_NAMES", "").split(",")
    is_classes = (
        info.dtype in ("uint8", "uint16")
        and info.tags.get("GEOSERVE_OUTPUT", "classes") == "classes"
    )
    colormap = info.colormap if is_classes and info.dtype == "uint8" else None
    label = info.descriptions[0] or "band 1"
    which = f", band 1 of {info.count}" if info.count > 1 else ""
    aspect = rgb.shape[0] / rgb.shape[1]  # the two panels share the input's shape
    fig, axes = plt.subplots(1, 2, figsize=(12, min(12.0, max(3.0, 6 * aspect)) + 1.0), dpi=100)
    axes[0].imshow(rgb, interpolation="nearest")
    axes[0].set_title(f"input: {Path(input_path).name}\n{shown}", fontsize=9)
    if is_classes:
        n = max(len(names), int(pred.max()) + 1 if pred.count() else 1)
        grey = (128, 128, 128, 255)
        colors = [
            (r / 255, g / 255, b / 255, a / 255)
            for r, g, b, a in ((colormap or {}).get(i, grey) for i in range(n))
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
        # beside the panel, outside the layout: the panel keeps the size of the other one
        cax = axes[1].inset_axes((1.03, 0.0, 0.03, 1.0))
        cax.set_in_layout(False)
        fig.colorbar(image, cax=cax, label=label)
    axes[1].set_title(f"prediction: {Path(output_path).name}{which}", fontsize=9)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle(caption, y=0.04, fontsize=9)
    # the right margin holds a colour bar when there is one; the same layout either way
    fig.tight_layout(rect=(0, 0.05, 0.9, 1))
    png = Path(png_path)
    try:
        fig.savefig(png)
    except OSError as exc:
        raise OutputWriteError(f"{png}: cannot write quicklook ({exc})") from exc
    finally:
        plt.close(fig)
    return png
