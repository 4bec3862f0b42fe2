"""``out_format="xarray"``: a request's products as xarray (the optional ``xarray`` extra).

:class:`XarraySink` collects a product's rows like the tensor sink (the output is whole in
memory) and commits them as an ``xarray.DataArray`` (band, y, x): the values the GeoTIFF sink
would write, bit for bit, with pixel-centre ``x``/``y`` coords from the output's transform,
the CRS, transform and nodata written the rioxarray way (``da.rio.crs``,
``da.rio.transform()``, ``da.rio.nodata``), band names as the ``band`` coord (a GeoTIFF's band
descriptions) and the GeoTIFF's tags as attributes. :func:`to_dataset` joins a request's
products into one ``xarray.Dataset``. xarray and rioxarray are imported only here, when a
request asks for them.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from affine import Affine
from numpy.typing import NDArray

from geoserve.errors import ConfigError
from geoserve.raster.sinks import ArraySink
from geoserve.raster.write import OutputRaster
from geoserve.schemas import ImageOutput, OutFormat

if TYPE_CHECKING:
    import xarray

#: The dim of a product's bands (a Dataset names it ``<kind>_band``).
BAND = "band"


def check_installed() -> None:
    """Refuse ``out_format="xarray"`` where the extra is not installed.

    Raises:
        ConfigError: naming what to install.
    """
    missing = [m for m in ("xarray", "rioxarray") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"out_format='xarray' needs {' and '.join(missing)}: pip install 'geoserve[xarray]'"
        )


class XarraySink(ArraySink):
    """Collects rows into one array and commits it as an ``xarray.DataArray``."""

    def __init__(self, profile: Mapping[str, Any], height: int, width: int) -> None:
        check_installed()
        super().__init__(height, width)
        self.profile = dict(profile)

    def commit(self, out_format: OutFormat) -> ImageOutput:
        """The rows as a DataArray (see the module docstring)."""
        assert self.array is not None
        assert self.meta is not None
        out = self._described(out_format)
        out.xarray = to_dataarray(self.array, self.meta, self.profile)
        return out


def to_dataarray(
    data: NDArray[Any], meta: OutputRaster, profile: Mapping[str, Any]
) -> xarray.DataArray:
    """(bands, H, W) output values as a georeferenced DataArray (see the module docstring).

    Values a GeoTIFF stores in fewer bits than their dtype (``NBITS=16``: float32 kept as
    half floats, GDAL truncating the mantissa) are the values GDAL stores: see
    :func:`_as_stored`.
    """
    import rioxarray  # noqa: F401  (registers .rio)
    import xarray as xr

    if meta.nbits is not None:
        data = _as_stored(data, meta.nbits)
    count, height, width = data.shape
    transform = profile.get("transform") or Affine.identity()
    crs = profile.get("crs")
    names: list[Any] = list(meta.descriptions)
    if len(names) != count or not all(names):
        names = list(range(1, count + 1))
    coords: dict[str, Any] = {BAND: names}
    if transform.b == 0 and transform.d == 0:  # (a rotated grid has no 1-D coords)
        coords["x"] = transform.c + transform.a * (np.arange(width) + 0.5)
        coords["y"] = transform.f + transform.e * (np.arange(height) + 0.5)
    attrs: dict[str, Any] = {str(k): str(v) for k, v in meta.tags.items()}
    if meta.categories:  # a class map: CF's flag values and meanings
        attrs["flag_values"] = np.arange(len(meta.categories), dtype=data.dtype)
        attrs["flag_meanings"] = " ".join(c.replace(" ", "_") for c in meta.categories)
    da = xr.DataArray(data, dims=(BAND, "y", "x"), coords=coords, attrs=attrs)
    da = da.rio.write_transform(transform)
    if crs is not None:
        da = da.rio.write_crs(crs)
    if meta.nodata is not None:
        da = da.rio.write_nodata(meta.nodata, encoded=False)
    return cast("xarray.DataArray", da)


def _as_stored(data: NDArray[Any], nbits: int) -> NDArray[Any]:
    """``data`` as GDAL stores it with ``NBITS=nbits``: through an in-memory GeoTIFF.

    GDAL's own conversion, not a re-implementation of it (its float-to-half truncates where
    numpy's rounds to nearest). Only the ``float16`` embeddings have it: the token grid, small.
    """
    from rasterio.errors import NotGeoreferencedWarning as Ungeoreferenced
    from rasterio.io import MemoryFile

    count, height, width = data.shape
    profile = {"driver": "GTiff", "width": width, "height": height, "count": count}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Ungeoreferenced)  # (a grid-less copy, on purpose)
        with MemoryFile() as mem:
            with mem.open(**profile, dtype=data.dtype.name, NBITS=nbits) as dst:
                dst.write(data)
            with mem.open() as src:
                stored: NDArray[Any] = src.read()
    return stored


def to_dataset(by_kind: Mapping[str, ImageOutput]) -> xarray.Dataset:
    """A request's products (``outputs_by_kind`` of an xarray request) as one Dataset.

    One variable per kind, named after it: (y, x) for a one-band kind (its band name in
    ``long_name``), (``<kind>_band``, y, x) for more bands (``probabilities``: one per class).
    Every variable shares the request's ``x``/``y`` coords and CRS; a kind on another grid
    (``embeddings`` beside pixel kinds: the token grid) has its own, ``x_<kind>``/``y_<kind>``,
    its transform in its ``GeoTransform`` attribute.

    Raises:
        ConfigError: the outputs are not xarray ones (naming the out format to ask for).
    """
    import rioxarray  # noqa: F401
    import xarray as xr

    missing = [kind for kind, out in by_kind.items() if out.xarray is None]
    if missing or not by_kind:
        raise ConfigError(
            f"{', '.join(missing) or 'the request'}: no xarray output; ask for out_format='xarray'"
        )
    arrays = {kind: out.xarray for kind, out in by_kind.items() if out.xarray is not None}
    first = next(iter(arrays.values()))
    shape = (first.sizes["y"], first.sizes["x"])
    variables: dict[str, xr.DataArray] = {}
    for kind, da in arrays.items():
        if da.sizes[BAND] == 1:
            label = da.coords[BAND].values[0]
            da = da.squeeze(BAND, drop=True)
            if isinstance(label, str):
                da.attrs["long_name"] = label
        else:
            da = da.rename({BAND: f"{kind}_band"})
        if (da.sizes["y"], da.sizes["x"]) != shape:
            transform = da.rio.transform()
            da = da.drop_vars("spatial_ref").rename({"y": f"y_{kind}", "x": f"x_{kind}"})
            da.attrs["GeoTransform"] = " ".join(str(v) for v in transform.to_gdal())
        variables[kind] = da
    ds = xr.Dataset(variables)
    if first.rio.crs is not None:
        ds = ds.rio.write_crs(first.rio.crs)
    return cast("xarray.Dataset", ds.rio.write_transform(first.rio.transform()))
