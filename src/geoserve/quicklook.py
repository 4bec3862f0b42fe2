"""Quicklook pictures: the input beside the prediction, as one PNG (drawn with matplotlib).

The input is drawn as red/green/blue, each band stretched between its 2nd and 98th
percentile. Which bands, in this order of preference:

1. the file's band descriptions: B4/B3/B2, B04/B03/B02 or RED/GREEN/BLUE (any case);
2. the model's band roles (``GeoTiffPatcher(band_roles=...)``: which selected band is RED,
   GREEN, BLUE), for files whose bands have no descriptions;
3. Sentinel-2 L1C stack positions (bands 4, 3, 2) for 13-band files;
4. otherwise bands 1, 2, 3 as red, green, blue, not called true colour; band 1 in grey for
   files with fewer than three bands.

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
import rasterio
from numpy.typing import NDArray

from geoserve.errors import GeoServeError, OutputWriteError
from geoserve.raster.thumbnail import read_thumbnail
from geoserve.raster.trust import ALLOWABLE_INPUT_FORMATS, open_allowed

_RGB_NAMES = (("B4", "B3", "B2"), ("B04", "B03", "B02"), ("RED", "GREEN", "BLUE"))
_RGB = "red, green, blue"


def choose_bands(ds: Any, roles: Mapping[int, str] | None = None) -> tuple[list[int], str]:
    """The 1-based bands of ``ds`` to draw, and a few words saying which they are.

    Three bands are drawn as red, green, blue; one in grey. ``roles`` maps 0-based band
    indices to what the model says they are (``"RED"``, ...).
    """
    names = [(d or "").upper() for d in ds.descriptions]
    for triple in _RGB_NAMES:
        if all(n in names for n in triple):
            bands = [names.index(n) + 1 for n in triple]
            shown = ", ".join(ds.descriptions[b - 1] for b in bands)
            return bands, f"true colour: {_RGB} = {shown}"
    by_role = {role.upper(): i + 1 for i, role in (roles or {}).items()}
    if all(r in by_role for r in ("RED", "GREEN", "BLUE")):
        bands = [by_role["RED"], by_role["GREEN"], by_role["BLUE"]]
        return bands, f"true colour: {_RGB} = bands {_listed(bands)} (the model's band roles)"
    if ds.count == 13:  # Sentinel-2 L1C stack B1..B8, B8A, B9..B12
        return [4, 3, 2], f"true colour: {_RGB} = bands 4, 3, 2 (Sentinel-2 band order)"
    if ds.count >= 3:
        return [1, 2, 3], f"bands 1, 2, 3 as {_RGB} (bands not named)"
    return [1], "band 1 in grey"


def model_band_roles(in_proc: Any, path: str | os.PathLike[str]) -> dict[int, str]:
    """What ``in_proc`` says the bands of the file at ``path`` are: 0-based index -> role.

    See :meth:`~geoserve.processors.InputProcessor.band_roles_for`; empty when it says
    nothing or the file does not fit it.
    """
    if in_proc is None:
        return {}
    from geoserve.raster.source import open_raster

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the engine already warned about this file
            with open_raster(path, formats=ALLOWABLE_INPUT_FORMATS) as src:
                return dict(in_proc.band_roles_for(src.info))
    except GeoServeError:
        return {}


def _listed(bands: list[int]) -> str:
    return ", ".join(str(b) for b in bands)


def stretch_limits(bands: np.ma.MaskedArray[Any, Any]) -> list[tuple[float, float]]:
    """Each band's 2nd and 98th percentile over its unmasked pixels ((0, 1) when none)."""
    limits = []
    for band in bands.astype(np.float64):
        values = band.compressed()
        lo, hi = np.percentile(values, (2, 98)) if values.size else (0.0, 1.0)
        limits.append((float(lo), float(hi)))
    return limits


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


def _caption(ds: Any) -> str:
    crs = ds.crs
    if crs is None:
        return "not georeferenced"
    epsg = crs.to_epsg()
    name = f"EPSG:{epsg}" if epsg else crs.to_string()[:40]
    unit = "°" if crs.is_geographic else " m"
    return f"{name}, pixel {abs(ds.transform.a):.4g}{unit} x {abs(ds.transform.e):.4g}{unit}"


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

    with open_allowed(str(input_path)) as src:  # never by GDAL's sniffing
        bands, shown = choose_bands(src, roles)
        rgb = _stretch(read_thumbnail(src, bands, max_side))
        caption = _caption(src)
    with rasterio.open(output_path) as out:
        pred = read_thumbnail(out, [1], max_side)[0]
        names = out.tags().get("CLASS_NAMES", "").split(",")
        is_classes = (
            out.dtypes[0] in ("uint8", "uint16")
            and out.tags().get("GEOSERVE_OUTPUT", "classes") == "classes"
        )
        colormap = out.colormap(1) if is_classes and out.dtypes[0] == "uint8" else None
        label = out.descriptions[0] or "band 1"
        which = f", band 1 of {out.count}" if out.count > 1 else ""
    aspect = rgb.shape[0] / rgb.shape[1]  # the two panels share the input's shape
    fig, axes = plt.subplots(1, 2, figsize=(12, min(12.0, max(3.0, 6 * aspect)) + 1.0), dpi=100)
    axes[0].imshow(rgb, interpolation="nearest")
    axes[0].set_title(f"input: {Path(input_path).name}\n{shown}", fontsize=9)
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
