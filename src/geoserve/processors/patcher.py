"""The GeoTIFF patcher: geoserve's input processor.

It selects bands (by 0-based index or by band description), applies the model's scale factor and
per-band mean/std, masks nodata (the declared value, NaN and ±inf), fills masked pixels with
``fill`` (in normalised units, so 0 means "the band mean"), and cuts the image into the patches of
the request's :class:`~geoserve.raster.grid.PatchGrid`. Several inputs form the T dates of one
place and give (C, T, P, P) patches, the layout Prithvi models take.

Reading goes one grid row at a time: rows are read once per patch row, full width, then cut into
patches, so memory stays at (patch rows x width) per input regardless of scene height.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from affine import Affine
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from geoserve.errors import BandMismatchError, ConfigError, InputError, count
from geoserve.processors.base import InputProcessor, PatchRow, RasterContext
from geoserve.processors.row_band import RawBand, band_of, fetch_raw, pinned
from geoserve.raster.bands import resolve_bands
from geoserve.raster.coords import acquisition_date, centre_lonlat, year_doy
from geoserve.raster.grid import BlendMode, PatchGrid, check_tiling
from geoserve.raster.source import RasterArray, RasterInfo, RasterSource


@dataclass(frozen=True)
class GeoTiffPatcher(InputProcessor):
    """Cuts GeoTIFFs into normalised patches.

    Args:
        bands: Bands to feed the model, as 0-based indices or band descriptions (``"B8A"``);
            ``None`` takes every band.
        mean: Per-band mean subtracted after scaling; ``None`` means 0.
        std: Per-band standard deviation divided by after subtracting the mean; ``None`` means 1.
        scale_factor: Multiplies raw values first (e.g. 1e-4 for reflectance x 10000).
        patch_size: Model input size in pixels (square).
        stride: Step between patches; ``None`` gives 7/8 of the patch (1/8 overlap), or the
            patch size with ``blend="none"``.
        blend: How overlapping outputs are combined; see :mod:`geoserve.raster.grid`.
        num_frames: Dates per request; > 1 gives (C, T, P, P) patches.
        coords: Coordinates passed to the model as keyword arguments: ``"time"`` gives
            ``temporal_coords`` (T, 2: year, day of year from tags or file name) and
            ``"location"`` gives ``location_coords`` (2: lon, lat of the scene centre, the
            order of the reference inference scripts); ``True`` means both.
        bands_by_count: Band selections by the input's band count, tried before ``bands``
            (e.g. ``{13: (1, 2, 3, 8, 11, 12), 6: (0, 1, 2, 3, 4, 5)}`` for Sentinel-2 L1C
            stacks and 6-band HLS files).
        nodata: Override the input's declared nodata value.
        fill: Value (after normalisation) written into masked pixels before the model sees them.
        per_band_nodata: Each band's nodata is its own: only the nodata values themselves are
            replaced by ``fill`` (the pixel's other bands keep theirs), and a pixel counts as
            nodata (skipped, and nodata in every output band) only where every band (and
            date) is. With ``fill=float("nan")`` a per-pixel model then carries each band's
            nodata to its output as NaN: ``identity`` does, and gives back its input exactly.
            By default a pixel that is nodata in any band is filled in every band and is
            nodata in every output band.
        band_roles: What each selected band is, in selection order (e.g. ``("BLUE", "GREEN",
            "RED", "NIR_NARROW", "SWIR_1", "SWIR_2")``); for people and pictures only: a
            quicklook of a file whose bands have no descriptions draws RED, GREEN and BLUE
            from them.
    """

    bands: tuple[int | str, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale_factor: float = 1.0
    patch_size: int = 224
    stride: int = None  # type: ignore[assignment]  # resolved in __post_init__
    blend: BlendMode = "center"
    num_frames: int = 1
    coords: bool | tuple[str, ...] = False
    bands_by_count: (
        Mapping[int, Sequence[int | str]] | tuple[tuple[int, tuple[int | str, ...]], ...] | None
    ) = None
    nodata: float | None = None
    fill: float = 0.0
    per_band_nodata: bool = False
    band_roles: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("bands", "mean", "std", "band_roles"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if isinstance(self.bands_by_count, Mapping):
            object.__setattr__(
                self,
                "bands_by_count",
                tuple((int(k), tuple(v)) for k, v in sorted(self.bands_by_count.items())),
            )
        if self.coords is True:
            object.__setattr__(self, "coords", ("time", "location"))
        elif self.coords is False:
            object.__setattr__(self, "coords", ())
        elif not set(self.coords) <= {"time", "location"}:
            raise ConfigError(f"invalid coords {self.coords!r}; use 'time' and/or 'location'")
        if self.stride is None:
            default = self.patch_size if self.blend == "none" else max(1, self.patch_size * 7 // 8)
            object.__setattr__(self, "stride", default)
        check_tiling(self.patch_size, self.stride, self.blend)
        n = self.in_channels
        for name in ("mean", "std", "band_roles"):
            value = getattr(self, name)
            if value is not None and n is not None and len(value) != n:
                raise ConfigError(
                    f"{count(n, 'band')} selected, but the model's {name} has "
                    f"{count(len(value), 'value')} (one per band it reads)"
                )
        if self.std is not None and any(s == 0 for s in self.std):
            raise ConfigError(f"std must not contain 0, got {self.std!r}")
        if not isinstance(self.num_frames, int) or self.num_frames < 1:
            raise ConfigError(f"invalid num_frames: {self.num_frames!r}; must be >= 1")

    @property
    def in_channels(self) -> int | None:
        """Number of model input bands, when the configuration fixes it."""
        for value in (self.bands, self.mean, self.std):
            if value is not None:
                return len(value)
        return None

    def replace(self, **changes: Any) -> GeoTiffPatcher:
        """Copy with changes.

        A new ``patch_size`` or ``blend`` re-derives a default stride; new ``bands`` drop the
        ``band_roles`` of the old ones.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        if ("patch_size" in changes or "blend" in changes) and "stride" not in changes:
            changes["stride"] = None
        if "bands" in changes and "band_roles" not in changes:
            changes["band_roles"] = None
        return dataclasses.replace(self, **changes) if changes else self

    # -- per request -----------------------------------------------------------------------

    def prepare(self, sources: Sequence[RasterSource]) -> RasterContext:
        """Validate the inputs and plan the grid; see :meth:`InputProcessor.prepare`."""
        infos = [s.info for s in sources]
        if len(infos) != self.num_frames:
            hint = " (pass the dates of one place as one list)" if self.num_frames > 1 else ""
            raise InputError(
                f"{infos[0].name}: model takes {self.num_frames} date(s) per request, "
                f"got {len(infos)}{hint}"
            )
        first = infos[0]
        _check_same_grid(first, infos[1:])
        bands = self._select(first)
        for info in infos[1:]:
            if self._select(info) != bands:
                raise BandMismatchError(f"{info.name}: bands differ from {first.name}")
        n = self.in_channels
        if n is not None and len(bands) != n:
            raise BandMismatchError(
                f"{first.name} has {count(len(bands), 'band')}; the model needs {n}"
            )
        nodata = self.nodata if self.nodata is not None else first.nodata
        names = tuple(first.descriptions[b] or f"band_{b + 1}" for b in bands)
        kwargs: dict[str, NDArray[np.float32]] = {}
        if "time" in self.coords:  # type: ignore[operator]
            kwargs["temporal_coords"] = np.array(
                [year_doy(acquisition_date(i)) for i in infos], dtype=np.float32
            )
        if "location" in self.coords:  # type: ignore[operator]
            kwargs["location_coords"] = np.array(centre_lonlat(first), dtype=np.float32)
        grid = PatchGrid(first.height, first.width, self.patch_size, self.stride, self.blend)
        return RasterContext(
            grid=grid,
            names=tuple(i.name for i in infos),
            bands=tuple(bands),
            band_names=names,
            profile={**first.profile, "nodata": nodata},
            has_nodata=nodata is not None or any(np.dtype(i.dtype).kind == "f" for i in infos),
            model_kwargs=kwargs,
            dtypes=tuple(i.dtype for i in infos) if len({i.dtype for i in infos}) > 1 else (),
        )

    def _select(self, info: RasterInfo) -> list[int]:
        """0-based indices of the bands of ``info`` fed to the model."""
        selectors = dict(self.bands_by_count or ()).get(info.count, self.bands)  # type: ignore[arg-type]
        return resolve_bands(info, selectors)

    def band_roles_for(self, info: RasterInfo) -> dict[int, str]:
        """The role (``band_roles``) of each band of ``info`` the model reads, by 0-based index.

        Raises:
            BandMismatchError: the file lacks a band the model selects.
        """
        if not self.band_roles:
            return {}
        return dict(zip(self._select(info), self.band_roles, strict=False))

    def read_row(self, sources: Sequence[RasterSource], ctx: RasterContext, row: int) -> PatchRow:
        """Read grid row ``row`` of every date and cut it into normalised patches (numpy).

        The patches are strided views into one normalised band of rows (no per-patch copies:
        overlapping patches share memory); batching copies them once, into the batch.
        """
        return self.cut_row(self._fetch_own(sources, ctx, row, None), ctx, row)

    def read_row_on(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        device: torch.device,
    ) -> PatchRow:
        """Like :meth:`read_row`, but the cast, normalisation and cutting run in torch.

        The raw band (uint16 for most scenes, half the bytes of float32) is copied to
        ``device`` once, from pinned memory on CUDA (the rows are put straight into pinned
        memory, reflected edges included), and the patches stay there for the model.

        Gives the same values as :meth:`read_row` (the same float32 operations in the same
        order; the tests compare them bit for bit on CPU tensors).
        """
        return self.cut_row(self._fetch_own(sources, ctx, row, device), ctx, row, device)

    def fetch_row(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        device: torch.device | None = None,
    ) -> Any:
        """The raw rows under grid row ``row`` (:meth:`fetch_raw`); pinned for a CUDA device.

        A subclass that reads rows its own way (overrides :meth:`read_row`, :meth:`read_row_on`
        or :meth:`read_band`) is honoured: its read is the fetch (in row order), and nothing
        of it runs in parallel.
        """
        if _overridden(type(self)) == "row":
            return super().fetch_row(sources, ctx, row, device)  # its read_row(_on), whole
        return self._fetch_own(sources, ctx, row, device)

    def _fetch_own(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        device: torch.device | None,
    ) -> Any:
        """The fetch of :meth:`fetch_row`: the raw rows, or a subclass's own :meth:`read_band`."""
        if _overridden(type(self)) == "band":
            return self.read_band(sources, ctx, row)
        cuda = device is not None and device.type == "cuda"
        return self.fetch_raw(sources, ctx, row, pinned if cuda else np.empty)

    def cut_row(
        self,
        fetched: Any,
        ctx: RasterContext,
        row: int,
        device: torch.device | None = None,
    ) -> PatchRow:
        """Normalise and cut the raw rows :meth:`fetch_row` gave (in torch on ``device``)."""
        if isinstance(fetched, PatchRow):  # a subclass's own read_row
            return fetched
        band = fetched if isinstance(fetched, RawBand) else self.band_of(fetched, ctx, row)
        if device is not None:
            return self._cut_torch(band, ctx, row, device)
        grid = ctx.grid
        data = self.normalize(band.raw)
        if band.invalid is not None:
            data[..., band.invalid] = self.fill
        windows = sliding_window_view(data, grid.patch_size, axis=-1)[..., :: grid.stride, :]
        patches = np.moveaxis(windows, -2, 0)  # (cols, C, [T,] P, P), a view
        if len(band.cols) < grid.cols:
            patches = patches[list(band.cols)]
        return PatchRow(row=row, cols=band.cols, patches=patches, core_valid=band.core_valid)

    def _cut_torch(
        self, band: RawBand, ctx: RasterContext, row: int, device: torch.device
    ) -> PatchRow:
        if device.type != "cuda":
            patches = self._cut_on(band, ctx, device)
        else:
            # on the reader thread's own stream, so the copy and the cutting overlap the
            # model's kernels on the default stream; the patches are then marked as used there
            stream = _reader_stream(device)
            with torch.cuda.stream(stream):
                patches = self._cut_on(band, ctx, device)
            patches.record_stream(torch.cuda.default_stream(device))
            stream.synchronize()
        return PatchRow(row=row, cols=band.cols, patches=patches, core_valid=band.core_valid)

    def _cut_on(self, band: RawBand, ctx: RasterContext, device: torch.device) -> torch.Tensor:
        raw = torch.from_numpy(np.ascontiguousarray(band.raw))
        if device.type == "cuda" and not raw.is_pinned():  # (fetch_row pins what it can)
            raw = raw.pin_memory()
        x = raw.to(device, non_blocking=True).to(torch.float32)
        if self.scale_factor != 1.0:
            x *= torch.tensor(self.scale_factor, dtype=torch.float32, device=device)
        shape = (-1,) + (1,) * (x.ndim - 1)
        if self.mean is not None:
            x -= torch.tensor(self.mean, dtype=torch.float32, device=device).reshape(shape)
        if self.std is not None:
            x /= torch.tensor(self.std, dtype=torch.float32, device=device).reshape(shape)
        if band.invalid is not None:
            x[..., torch.from_numpy(band.invalid).to(device)] = self.fill
        p, stride = ctx.grid.patch_size, ctx.grid.stride
        patches = x.unfold(-1, p, stride)  # (..., P rows, cols, P cols), a view
        patches = torch.movedim(patches, -2, 0)
        if len(band.cols) < ctx.grid.cols:
            patches = patches[torch.tensor(band.cols, device=device, dtype=torch.long)]
        return patches.contiguous()

    def read_band(self, sources: Sequence[RasterSource], ctx: RasterContext, row: int) -> RawBand:
        """The raw rows under grid row ``row``, their invalid pixels, and the patch columns.

        Rows and columns past the image edges are reflected (see :func:`reflect_indices`).
        """
        return self.band_of(self.fetch_raw(sources, ctx, row), ctx, row)

    def fetch_raw(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        alloc: Callable[[tuple[int, ...], np.dtype[Any]], NDArray[Any]] = np.empty,
    ) -> NDArray[Any]:
        """The raw rows under grid row ``row``, every date (see :func:`fetch_raw`)."""
        return fetch_raw(sources, ctx, row, self.num_frames, alloc)

    def band_of(self, raw: NDArray[Any], ctx: RasterContext, row: int) -> RawBand:
        """:meth:`read_band` of the raw rows :meth:`fetch_raw` gave (see :func:`band_of`)."""
        return band_of(raw, ctx, row, self.per_band_nodata)

    def normalize(self, raw: NDArray[Any]) -> NDArray[np.float32]:
        """(raw * scale_factor - mean) / std, per band (the first axis), in float32."""
        shape = (-1,) + (1,) * (raw.ndim - 1)  # per band, for (C, rows, W) and (C, T, rows, W)
        x: NDArray[np.float32]
        if self.scale_factor != 1.0:  # the cast and the scaling in one pass (the same values)
            x = np.multiply(raw, np.float32(self.scale_factor), dtype=np.float32, casting="unsafe")
        else:
            x = raw.astype(np.float32)
        if self.mean is not None:
            x -= np.asarray(self.mean, dtype=np.float32).reshape(shape)
        if self.std is not None:
            x /= np.asarray(self.std, dtype=np.float32).reshape(shape)
        return x

    def dummy_input(self, seed: int = 0) -> RasterArray:
        """A seeded 2-patch-wide uint16 raster with named bands in a UTM CRS."""
        from rasterio.crs import CRS

        rng = np.random.default_rng(seed)
        count = max(
            [b + 1 for b in self.bands or () if isinstance(b, int)] + [self.in_channels or 3]
        )
        names = [f"band_{i + 1}" for i in range(count)]
        for i, b in enumerate(self.bands or ()):
            if isinstance(b, str):
                names[i] = b
        size = self.patch_size + self.stride
        data = rng.integers(0, 10000, size=(count, size, size), dtype=np.uint16)
        profile = {
            "crs": CRS.from_epsg(32633),
            "transform": Affine(10, 0, 300000, 0, -10, 5800000),
            "descriptions": names,
            "tags": {"ACQUISITION_DATE": "2020-06-01"},
        }
        return RasterArray(data, profile, name="<dummy>")


@functools.cache
def _overridden(cls: type) -> str | None:
    """Which of the row reads a subclass of :class:`GeoTiffPatcher` overrides, if any.

    (Once per class: it is asked for every row.)
    """
    if any(getattr(cls, n) is not getattr(GeoTiffPatcher, n) for n in ("read_row", "read_row_on")):
        return "row"
    if cls.read_band is not GeoTiffPatcher.read_band:  # type: ignore[attr-defined]
        return "band"
    return None


_streams = threading.local()


def _reader_stream(device: torch.device) -> torch.cuda.Stream:
    """The calling thread's CUDA side stream for ``device`` (one per thread and device)."""
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    stream: torch.cuda.Stream = streams[device]
    return stream


def _check_same_grid(first: RasterInfo, others: Sequence[RasterInfo]) -> None:
    for info in others:
        if (info.width, info.height) != (first.width, first.height):
            raise InputError(
                f"{info.name} is {info.width}x{info.height} but {first.name} is "
                f"{first.width}x{first.height}; dates of one place must share one grid"
            )
        if info.crs != first.crs or not info.transform.almost_equals(first.transform):
            raise InputError(
                f"{info.name}: CRS or transform differs from {first.name}; "
                "dates of one place must share one grid"
            )
