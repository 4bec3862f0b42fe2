"""The ``geoserve`` accessor on xarray DataArrays, for notebooks (the optional ``xarray`` extra).

``import geoserve.xarray`` registers it::

    import geoserve.xarray  # noqa: F401  (registers da.geoserve)

    ds = cube.geoserve.predict("demo-water", output_kind=["classes", "confidence"])
    ds["classes"].plot()

``cube`` is a DataArray (band, [time,] y, x) with its CRS and transform set the rioxarray way,
numpy- or Dask-backed (a Dask cube is computed one grid row at a time, never whole);
``predict`` returns its products as an ``xarray.Dataset`` (one variable per output kind, see
:func:`geoserve.raster.xarray_sink.to_dataset`). The engine of each model is built on first use
and kept for the process (:func:`engine_for`): later calls skip loading the model again. An engine
runs one call at a time; a threaded caller builds its own :class:`~geoserve.Engine` per thread
and passes it as ``engine=``. :func:`close_engines` releases them.

This module imports xarray; the rest of geoserve does not (it reads a DataArray given to it
only when xarray is already imported: :mod:`geoserve.raster.cube`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import xarray as xr

if TYPE_CHECKING:
    from geoserve.engine import Engine

_ENGINES: dict[tuple[str, str], Engine] = {}
_LOCK = threading.Lock()


def engine_for(model: str = "demo-water", **config: Any) -> Engine:
    """The process's engine of ``model`` built with ``config`` (EngineConfig fields), cached.

    The same model and options give the same engine (built once per process).
    """
    from geoserve.engine import Engine

    key = (model, repr(sorted(config.items())))
    with _LOCK:
        found = _ENGINES.get(key)
        if found is None:
            found = _ENGINES[key] = Engine(model, **config)
        return found


def close_engines() -> None:
    """Close and forget every engine :func:`engine_for` built."""
    with _LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
    for built in engines:
        built.close()


def predict(
    cube: xr.DataArray,
    model: str = "demo-water",
    *,
    output_kind: str | Sequence[str] | None = None,
    bands: Sequence[int | str] | None = None,
    dates: Any = None,
    seed: int = 0,
    engine: Engine | None = None,
    **config: Any,
) -> xr.Dataset:
    """``cube``'s products by ``model`` as a Dataset (see the module docstring).

    ``output_kind``, ``bands``, ``dates`` and ``seed`` are the request's
    (:meth:`geoserve.Engine.generate_image`); ``config``: EngineConfig fields of the cached
    engine (``max_batch_patches=8``); ``engine``: run on this one instead.

    Raises:
        GeoServeError: the request's error (a subclass naming the field at fault).
    """
    run_on = engine if engine is not None else engine_for(model, **config)
    result = run_on.generate_image(
        cast(Any, cube),
        out_format="xarray",
        output_kind=output_kind,
        bands=bands,
        dates=dates,
        seed=seed,
    )
    return cast(xr.Dataset, result.dataset)


@xr.register_dataarray_accessor("geoserve")  # type: ignore[no-untyped-call]
class GeoserveAccessor:
    """``da.geoserve``: run a geoserve model on this DataArray."""

    def __init__(self, da: xr.DataArray) -> None:
        self._da = da

    def predict(self, model: str = "demo-water", **options: Any) -> xr.Dataset:
        """The DataArray's products by ``model`` as a Dataset (:func:`predict`'s options)."""
        return predict(self._da, model, **options)
