"""Map tiles of a scene: the model's prediction computed for just the tile, or the scene itself.

:class:`TileService` answers one tile at a time on an
:class:`~geoserve.engine.AsyncEngine`: a prediction tile is the cut-out of
:mod:`~geoserve.tiles.plan` submitted as a request like any other (so concurrent tiles, and
whole-scene requests, share batches), its patches named in the service's
:class:`~geoserve.engine.patch_cache.PatchCache` (a patch already predicted for a neighbouring
tile or another zoom does not run again); the blended raw outputs of the inner window become
the class map or the confidence through the model's own output processor, as its GeoTIFFs do
(the same classes, nodata and colour table: :meth:`TileService.finalized`), warped onto the
tile nearest or bilinear. ``kind="input"`` draws the scene in true colour from the model's
band roles. Below the scene's on-demand zoom
(:func:`~geoserve.tiles.mercator.min_zoom`) a tile comes from the stored whole-scene
prediction when there is one, else :class:`~geoserve.errors.ZoomTooLowError`. Classes asked
for as ``hidden`` are drawn transparent (see :meth:`TileService.transparent_classes`).

Sources are resolved and checked by the caller (the server's trust rules): the service gets
a :class:`TileSource`, a path GDAL may open and an identity that changes with the content.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import rasterio
from affine import Affine
from numpy.typing import NDArray
from rasterio.enums import Resampling
from rasterio.windows import Window

from geoserve.engine.batch import PatchKeys
from geoserve.engine.patch_cache import PatchCache
from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import ConfigError, InputError, ZoomTooLowError
from geoserve.processors.base import OutputProcessor, RasterContext
from geoserve.raster.budget import OpenBudget
from geoserve.raster.grid import PatchGrid
from geoserve.raster.source import RasterSource, RasterWindow, open_raster
from geoserve.raster.warp import TargetGrid, WarpedSource
from geoserve.raster.write import OutputRaster
from geoserve.tiles.mercator import (
    MAX_SCENE_PIXELS_PER_TILE_PIXEL,
    TILE,
    WEB_MERCATOR,
    min_zoom,
    tile_transform,
)
from geoserve.tiles.plan import SceneGeometry, TilePlan, plan_tile
from geoserve.tiles.render import (
    EMPTY,
    classes_rgba,
    png,
    ramp_rgba,
    true_colour_rgba,
    warp_to_tile,
)

TileKind = Literal["classes", "confidence", "input"]
T = TypeVar("T")
#: Prediction tiles read and run at once; more wait their turn (a map asks for dozens at a
#: time, each holding its cut-out in memory: 16 of about 25 MB fit the server's default
#: memory bound beside other requests, and still fill batches together).
TILES_AT_ONCE = 16
#: True-colour tiles are drawn from this many zooms below the on-demand zoom (a tile then
#: spans at most 4 x 4 = 16 scene pixels per tile pixel, read decimated).
INPUT_ZOOMS_BELOW = 2
#: Most scene pixels a side that one prediction tile's cut-out may take.
MAX_CUT_SIDE = 4096
TILE_KINDS: tuple[str, ...] = ("classes", "confidence", "input")


@dataclass(frozen=True)
class TileSource:
    """A scene to tile: ``path`` for GDAL (a file or ``/vsicurl/`` URL), checked by the caller.

    ``identity`` names its content for the patch cache: the path with its modification time
    and size, or a URL with its ETag. ``prediction`` is a stored whole-scene class map of it,
    used below the on-demand zoom.
    """

    name: str
    path: str
    identity: Hashable
    prediction: Path | None = None


class TileService:
    """Prediction and true-colour tiles on one engine; see the module docstring."""

    def __init__(
        self,
        engine: Any,
        cache: PatchCache,
        formats: tuple[str, ...],
        timeout_s: float,
        budget: Callable[[float], OpenBudget] | None = None,
    ) -> None:
        self.engine = engine  # an AsyncEngine
        self.cache = cache
        self.formats = formats
        self.timeout_s = timeout_s
        self.budget = budget  # a tile's allowance for remote opens, from its deadline
        # a scene's true-colour bands and stretch (read once per scene content)
        self._colour = functools.lru_cache(maxsize=64)(self._true_colour)
        self._turns: asyncio.Semaphore | None = None  # made on the event loop that uses it
        self._procs: dict[str, OutputProcessor] = {}  # the model's own, by tile kind
        self._colors: list[tuple[int, int, int]] | None = None

    async def _opened(self, source: TileSource, open_: Callable[..., T], *args: Any) -> T:
        """``open_(*args)``, which opens ``source``, in the engine's admission threads.

        Under the tile's deadline and the server's remote budget, as a request's inputs are.
        """
        deadline = time.monotonic() + self.timeout_s
        budget = (
            self.budget(deadline)
            if self.budget is not None
            else OpenBudget(deadline, timeout_s=self.timeout_s)
        )
        remote = source.path.startswith("/vsicurl/")
        call = functools.partial(open_, *args)
        result: T = await self.engine.opening(call, remote=remote, budget=budget, what=source.name)
        return result

    @property
    def _model(self) -> Any:
        return self.engine.engine

    def geometry(self, source: TileSource) -> SceneGeometry:
        """The scene's grid (opened through the trust rules, headers only)."""
        return _geometry(source.path, source.identity, self.formats)

    async def tile(
        self,
        source: TileSource,
        z: int,
        x: int,
        y: int,
        kind: TileKind,
        hidden: Collection[int] = (),
    ) -> bytes:
        """The PNG of tile ``(z, x, y)`` of ``source`` (transparent outside it).

        ``hidden``: class codes drawn transparent on a ``classes`` tile.

        Raises:
            InputError: ``kind`` is not one this model can draw.
            ZoomTooLowError: below the on-demand zoom, with no stored prediction.
            GeoServeError: the scene cannot be read or the request failed.
        """
        if kind not in TILE_KINDS:
            raise InputError(f"kind: {kind!r} is not a tile kind; choose {', '.join(TILE_KINDS)}")
        geometry = await self._opened(source, self.geometry, source)
        zmin = geometry.minzoom
        if self._turns is None:
            self._turns = asyncio.Semaphore(TILES_AT_ONCE)
        if kind == "input":
            if z < zmin - INPUT_ZOOMS_BELOW:
                raise ZoomTooLowError(
                    f"zoom {z}: {source.name} is drawn from zoom {zmin - INPUT_ZOOMS_BELOW}; "
                    f"zoom in to level >= {zmin - INPUT_ZOOMS_BELOW}"
                )
            async with self._turns:
                return await self._opened(source, self._input_tile, source, geometry, z, x, y)
        if not self.class_names():  # (confidence is a softmax over classes too)
            raise InputError(
                f"kind: model {self._model.spec.name!r} gives no classes; ask for kind=input"
            )
        self.processor(kind)  # (a kind the model's processor cannot make: refused before work)
        if z < zmin:
            if source.prediction is not None and source.prediction.exists():
                return await asyncio.to_thread(
                    self.stored_tile, source.prediction, z, x, y, kind, hidden
                )
            raise ZoomTooLowError(
                f"zoom {z}: {source.name} is predicted on demand from zoom {zmin} (a tile "
                f"pixel at most {MAX_SCENE_PIXELS_PER_TILE_PIXEL} scene pixels wide); zoom in "
                f"to level >= {zmin}, or run the whole scene first"
            )
        grid = self._model.in_proc
        plan = plan_tile(geometry, z, x, y, grid.patch_size, grid.stride)
        if plan is None:
            return EMPTY
        self._check_cut(plan, geometry)
        async with self._turns:
            raw = await self._predict(source, plan, f"{z}/{x}/{y}")
        return await asyncio.to_thread(self._render, raw, geometry, plan, (z, x, y), kind, hidden)

    # -- prediction tiles ----------------------------------------------------------------------

    def _check_cut(self, plan: TilePlan, g: SceneGeometry) -> None:
        """Refuse a cut-out too large to read (before a pixel of it is read)."""
        side = max(int(plan.cut.width), int(plan.cut.height))
        if side > MAX_CUT_SIDE:  # (a grid far from WebMercator's shape at this zoom)
            raise ZoomTooLowError(
                f"this tile needs {side} pixels of the scene a side (at most {MAX_CUT_SIDE}); "
                "zoom in"
            )

    def class_names(self) -> list[str]:
        """The model's class names (none for a model without classes)."""
        out = self._model.model_out_proc  # the model's own processor: its classes, colours
        return list(getattr(out, "classes", ()) or ())

    def transparent_classes(self) -> list[int]:
        """The classes a map draws transparent by default (a background over the scene).

        Those the model's output processor names in a ``transparent_classes`` attribute
        (class names), else the first class of a two-class map (say "not water"), else none.
        """
        names = self.class_names()
        declared = getattr(self._model.model_out_proc, "transparent_classes", None)
        if declared is None:
            return [0] if len(names) == 2 else []
        return [names.index(n) for n in declared if n in names]

    def confidence_range(self) -> tuple[float, float]:
        """The confidence drawn at the ramp's two ends: 1 / classes (a tie) to 1."""
        return 1.0 / max(len(self.class_names()), 1), 1.0

    def processor(self, kind: str) -> OutputProcessor:
        """The model's own output processor for ``kind`` (``classes`` or ``confidence``).

        Raises:
            InputError: the model's processor cannot make ``kind`` (naming what it offers).
        """
        proc = self._procs.get(kind)
        if proc is None:
            try:
                (proc,) = self._model.output_processors([kind])
            except ConfigError as exc:
                raise InputError(f"kind: {exc}; ask for kind=input") from None
            self._procs[kind] = proc
        return proc

    def finalized(self, raw: NDArray[np.float32], kind: str) -> OutputRaster:
        """Blended outputs (C, h, w), NaN where nothing is known, as the model's ``kind`` output.

        Made by the model's own output processor, as the kind's GeoTIFF is: the same class
        map with its colour table, or the same confidence; nodata where ``raw`` is not finite
        (the input's nodata, outside the scene, or the model's NaN).
        """
        h, w = raw.shape[1:]
        grid = self._model.in_proc
        ctx = RasterContext(  # the tile's values: no input bands of their own, NaN for nodata
            grid=PatchGrid(h, w, grid.patch_size, grid.stride, grid.blend),
            names=("tile",),
            bands=(),
            band_names=(),
            profile={},
            has_nodata=True,
        )
        valid = np.asarray(np.isfinite(raw).all(axis=0), dtype=np.bool_)
        return self.processor(kind).finalize(raw, valid, ctx)

    def colors(self) -> list[tuple[int, int, int]]:
        """The model's class colours: the colour table of its class maps (none: no classes)."""
        if self._colors is None:
            n = len(self.class_names())
            probe = self.finalized(np.zeros((n, 1, 1), np.float32), "classes") if n else None
            self._colors = _class_colors(probe, n)
        return self._colors

    async def _predict(self, source: TileSource, plan: TilePlan, label: str) -> NDArray[Any]:
        # the cut-out is read by the engine like any input: the bands the model uses, a band
        # of rows at a time, under the server's bounds on pixels and memory
        cut = RasterWindow(source.path, Window(*plan.cut.flatten()), f"{source.name} tile {label}")
        spec = RequestSpec(
            cut,
            request_id=f"tile-{uuid.uuid4().hex}",
            out_format="tensor",
            output_kind=["raw"],
            patch_keys=PatchKeys(self.cache, plan.key),
        )
        result = await self.engine.submit(spec, timeout=self.timeout_s)
        result.raise_for_error()
        rows, cols = plan.inner_in_cut
        return result.outputs.tensor.numpy()[:, rows, cols]  # type: ignore[no-any-return]

    def _render(
        self,
        raw: NDArray[Any],
        g: SceneGeometry,
        plan: TilePlan,
        zxy: tuple[int, int, int],
        kind: TileKind,
        hidden: Collection[int],
    ) -> bytes:
        z, x, y = zxy
        transform = rasterio.windows.transform(plan.inner, g.transform)
        out = self.finalized(raw, kind)
        values = _float_values(out)
        if kind == "classes":
            tile = warp_to_tile(values, transform, g.crs, z, x, y, Resampling.nearest)
            colors = _class_colors(out, len(self.class_names()))
            return png(classes_rgba(tile[0], colors, hidden=hidden))
        tile = warp_to_tile(values, transform, g.crs, z, x, y, Resampling.bilinear)
        return png(ramp_rgba(tile[0], *self.confidence_range()))

    def stored_tile(
        self, path: Path, z: int, x: int, y: int, kind: TileKind, hidden: Collection[int] = ()
    ) -> bytes:
        """A tile of a stored whole-scene output (a class map, or a confidence map).

        Transparent outside the output, where it has no value, and for the classes in
        ``hidden``.

        Raises:
            InputError: the file is not georeferenced, or not of the kind asked for.
        """
        with _open(str(path), self.formats) as src:
            info = src.info
            if not info.is_georeferenced:
                raise InputError(f"{path.name}: has no CRS or transform; a map cannot place it")
            kind_of = np.dtype(info.dtype).kind
            is_map = info.count == 1 and kind_of in "ui"
            is_conf = info.count == 1 and kind_of == "f"
            if (kind == "classes" and not is_map) or (kind == "confidence" and not is_conf):
                what = "class map" if kind == "classes" else "confidence map"
                raise InputError(f"kind: {path.name} is not a {what} (one band, {info.dtype})")
            grid = TargetGrid(WEB_MERCATOR, tile_transform(z, x, y), TILE, TILE)
            if grid.coverage(info) == 0:  # beside the output: transparent
                return EMPTY
            # through the warper every input takes: NaN outside the output and at its nodata
            warped = WarpedSource(src, grid, "nearest" if kind == "classes" else "bilinear")
            try:
                data = warped.read_rows(0, TILE, [0])[0]
            finally:
                warped.release()  # (the output itself is closed on leaving)
        if kind == "classes":
            return png(classes_rgba(data, self.colors(), hidden=hidden))
        return png(ramp_rgba(data, *self.confidence_range()))

    # -- true colour -------------------------------------------------------------------------

    def _input_tile(self, source: TileSource, g: SceneGeometry, z: int, x: int, y: int) -> bytes:
        bands, lo, hi = self._colour(source.path, source.identity)
        plan = plan_tile(g, z, x, y, 1, 1)
        if plan is None:
            return EMPTY
        inner = plan.inner
        # read at about twice the tile's size (GDAL takes an overview where the file has one)
        step = max(1, math.ceil(max(inner.width, inner.height) / (2 * TILE)))
        shape = (len(bands), math.ceil(inner.height / step), math.ceil(inner.width / step))
        with _open(source.path, self.formats) as src:
            data = src.read(inner, bands, out_shape=shape[1:], masked=True)
        values = np.ma.filled(data.astype(np.float32), np.nan)
        transform = rasterio.windows.transform(inner, g.transform) @ Affine.scale(
            inner.width / shape[2], inner.height / shape[1]
        )
        tile = warp_to_tile(values, transform, g.crs, z, x, y, Resampling.bilinear)
        return png(true_colour_rgba(tile, lo, hi))

    def _true_colour(
        self, path: str, identity: Hashable
    ) -> tuple[list[int], list[float], list[float]]:
        """The 0-based bands drawn as red, green, blue, and their 2-98 % stretch over the scene.

        The bands come from the model's band roles; ``identity`` (the scene's content) keys
        the cache.
        """
        from geoserve.raster.thumbnail import read_thumbnail
        from geoserve.raster.true_colour import choose_bands, stretch_limits

        with _open(path, self.formats) as src:
            try:
                roles = dict(self._model.in_proc.band_roles_for(src.info))
            except Exception:  # the file does not fit the model: no roles
                roles = {}
            bands, _ = choose_bands(src.info, roles)
            if len(bands) == 1:
                bands = bands * 3
            thumb = read_thumbnail(src, bands, 512)
        limits = stretch_limits(thumb)
        return bands, [lo for lo, _ in limits], [hi for _, hi in limits]


def _float_values(out: OutputRaster) -> NDArray[np.float32]:
    """An output's first band as (1, h, w) float32, NaN where it holds its nodata value."""
    band = out.data[0]
    values: NDArray[np.float32] = band.astype(np.float32)
    if out.nodata is not None and not math.isnan(out.nodata):
        values[band == out.nodata] = np.nan
    return values[None]


def _class_colors(out: OutputRaster | None, n: int) -> list[tuple[int, int, int]]:
    """The RGB of classes 0 to n - 1 in a class map's colour table.

    A map without one (255 classes or more) is drawn in matplotlib's tab20, cycled.
    """
    table = (out.colormap if out is not None else None) or {}
    if all(i in table for i in range(n)):
        return [(table[i][0], table[i][1], table[i][2]) for i in range(n)]
    from matplotlib import colormaps

    tab = colormaps["tab20"]
    rgb = [tab(i % tab.N)[:3] for i in range(n)]
    return [(int(r * 255), int(g * 255), int(b * 255)) for r, g, b in rgb]


def _open(path: str, formats: tuple[str, ...]) -> RasterSource:
    """The scene opened through the trust rules (a file, or a ``/vsicurl/`` URL)."""
    remote = path.startswith("/vsicurl/")
    return open_raster(path, "auto" if remote else "path", formats=formats)


@functools.lru_cache(maxsize=64)
def _geometry(path: str, identity: Hashable, formats: tuple[str, ...]) -> SceneGeometry:
    with _open(path, formats) as src:
        info = src.info
    if not info.is_georeferenced:
        raise InputError(f"{info.name}: has no CRS or transform; a map cannot place it")
    try:
        zmin = min_zoom(info.crs, info.transform, info.width, info.height)
    except InputError as exc:
        raise InputError(f"{info.name}: {exc}") from None
    return SceneGeometry(
        identity, info.crs, info.transform, info.width, info.height, zmin, info.count
    )
