"""The multimodal patcher: the input processor of a model that takes several modalities.

A model such as TerraMind, or a flood mapper fusing radar with optical images, takes a dict of
modalities, each on its own grid in the request. :class:`MultimodalPatcher` declares them
(:class:`Modality`: bands, scaling and normalisation, resampling, required or optional) and
which grid the model sees (a modality's, the *reference*, or a fixed CRS and resolution). Every
other modality is warped onto that grid as the scene streams
(:mod:`geoserve.raster.align`), and the model's forward receives ``dict[str, Tensor]``, each
``(B, C_m, P, P)`` (``(B, C_m, T, P, P)`` for a modality with T dates). An optional modality
the request leaves out is absent from the dict.

Validity: a pixel is nodata (skipped, and nodata in the output) where any required modality is
nodata there; with no required modality, where every modality given is. Elsewhere a
modality's missing values (its nodata, or outside its footprint) are replaced by its ``fill``
(in normalised units; ``float("nan")`` lets the model see them as NaN).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from geoserve.errors import ConfigError, GeoServeError, InputError, prefixed
from geoserve.processors.base import (
    InputProcessor,
    Modalities,
    ModalityContext,
    Patches,
    PatchRow,
    RasterContext,
)
from geoserve.processors.patcher import GeoTiffPatcher
from geoserve.raster.align import RESAMPLINGS, ResamplingName, TargetGrid, aligned_modality
from geoserve.raster.grid import BlendMode, PatchGrid, check_tiling
from geoserve.raster.source import RasterArray, RasterSource
from geoserve.raster.warp import WarpedSource


@dataclass(frozen=True)
class Modality:
    """One modality a multimodal model takes.

    Args:
        name: The key of the request's dict and of the model's input dict (``"s2"``).
        bands: Bands fed to the model, as 0-based indices or band descriptions; ``None``: all.
        mean, std, scale_factor: Normalisation, as :class:`GeoTiffPatcher`'s.
        resampling: How it is put on the reference grid: ``bilinear`` for continuous values,
            ``nearest`` (or ``mode``) for categories such as land cover.
        required: A required modality must be in every request, and its nodata makes the
            pixel nodata; an optional one may be left out (absent from the model's dict).
        nodata: Override the input's declared nodata value.
        fill: Value (after normalisation) written where this modality has no data.
        num_frames: Dates of this modality per request.
    """

    name: str
    bands: tuple[int | str, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale_factor: float = 1.0
    resampling: ResamplingName = "bilinear"
    required: bool = True
    nodata: float | None = None
    fill: float = 0.0
    num_frames: int = 1

    def __post_init__(self) -> None:
        for name in ("bands", "mean", "std"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ConfigError(
                f"invalid modality name {self.name!r}; use letters, digits and '_' (e.g. 's2')"
            )
        if self.resampling not in RESAMPLINGS:
            raise ConfigError(
                f"modality {self.name!r}: invalid resampling {self.resampling!r}; choose one "
                f"of {', '.join(RESAMPLINGS)}"
            )


@dataclass(frozen=True)
class MultimodalPatcher(InputProcessor):
    """Cuts a request of several modalities into one dict of normalised patches per position.

    Args:
        modalities: What the model takes, in order.
        reference: The modality whose grid the model sees (the output's grid); ``None``:
            the first modality the request gives. Ignored when ``crs`` or ``resolution``
            is set.
        crs: A fixed CRS for the model's grid (``"EPSG:32633"``), over the reference
            modality's extent.
        resolution: A fixed pixel size for the model's grid, in the units of its CRS.
        patch_size, stride, blend: The patch grid, as :class:`GeoTiffPatcher`'s.
    """

    modalities: tuple[Modality, ...] = ()
    reference: str | None = None
    crs: str | None = None
    resolution: float | None = None
    patch_size: int = 224
    stride: int = None  # type: ignore[assignment]  # resolved in __post_init__
    blend: BlendMode = "center"
    num_frames: int = 1
    _parts: tuple[GeoTiffPatcher, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "modalities", tuple(self.modalities))
        if not self.modalities:
            raise ConfigError("a MultimodalPatcher needs at least one Modality")
        names = [m.name for m in self.modalities]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"modality {dupes[0]!r} is declared twice")
        if self.reference is not None and self.reference not in names:
            raise ConfigError(
                f"reference modality {self.reference!r} is not declared; "
                f"the modalities are {', '.join(names)}"
            )
        if self.stride is None:
            default = self.patch_size if self.blend == "none" else max(1, self.patch_size * 7 // 8)
            object.__setattr__(self, "stride", default)
        check_tiling(self.patch_size, self.stride, self.blend)
        if self.resolution is not None and not self.resolution > 0:
            raise ConfigError(f"invalid resolution {self.resolution!r}; must be > 0")
        parts = []
        for m in self.modalities:
            try:
                parts.append(
                    GeoTiffPatcher(
                        bands=m.bands,
                        mean=m.mean,
                        std=m.std,
                        scale_factor=m.scale_factor,
                        patch_size=self.patch_size,
                        stride=self.stride,
                        blend=self.blend,
                        num_frames=m.num_frames,
                        nodata=m.nodata,
                        fill=m.fill,
                    )
                )
            except ConfigError as exc:
                raise ConfigError(f"modality {m.name!r}: {exc}") from None
        object.__setattr__(self, "_parts", tuple(parts))

    @property
    def names(self) -> tuple[str, ...]:
        """The modalities' names, in order."""
        return tuple(m.name for m in self.modalities)

    @property
    def bands(self) -> tuple[int | str, ...] | None:
        """The first modality's bands (what ``bands=`` and ``--bands`` override)."""
        return self.modalities[0].bands

    def replace(self, **changes: Any) -> MultimodalPatcher:
        """Copy with changes; ``bands`` replaces the first modality's bands.

        A new ``patch_size`` or ``blend`` re-derives a default stride.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        if "bands" in changes:
            first = dataclasses.replace(self.modalities[0], bands=tuple(changes.pop("bands")))
            changes["modalities"] = (first, *self.modalities[1:])
        if ("patch_size" in changes or "blend" in changes) and "stride" not in changes:
            changes["stride"] = None
        return dataclasses.replace(self, **changes) if changes else self

    def reference_modality(self, names: Sequence[str]) -> str:
        """Its ``reference`` when the request gives it, else the first declared one given."""
        if self.reference is not None and self.reference in names:
            return self.reference
        return next((n for n in self.names if n in names), names[0])

    def resampling_of(self, modality: str) -> str:
        """The declared modality's resampling."""
        for m in self.modalities:
            if m.name == modality:
                return m.resampling
        return "bilinear"

    def band_selectors(self, modality: str | None = None) -> Sequence[int | str] | None:
        """The bands read of ``modality`` (the first one when None)."""
        for m in self.modalities:
            if modality is None or m.name == modality:
                return m.bands
        return None

    # -- per request -----------------------------------------------------------------------

    def prepare(self, sources: Sequence[RasterSource]) -> RasterContext:
        """A single input is the first modality (when it is the only required one).

        Raises:
            InputError: the model needs more than one modality.
        """
        first = self.modalities[0]
        others = [m.name for m in self.modalities[1:] if m.required]
        if others:
            raise InputError(
                f"{sources[0].info.name}: this model takes the modalities "
                f"{', '.join(self.names)} ({', '.join([first.name, *others])} required); "
                "give them as a dict, e.g. {'" + first.name + "': ..., '" + others[0] + "': ...}"
            )
        return self.prepare_modalities({first.name: sources})[1]

    def prepare_modalities(
        self, modalities: Modalities, threads: int = 1
    ) -> tuple[list[RasterSource], RasterContext]:
        """Check the modalities, align them on the model's grid and plan each one.

        Raises:
            InputError: an unknown or missing modality; BandMismatchError and others: naming
            the modality and its file.
        """
        given = self.check_names(modalities)
        for m in given:
            if m.nodata is not None:  # before warping, which must know the missing values
                for src in modalities[m.name]:
                    src.info = dataclasses.replace(src.info, nodata=m.nodata)
        ref_name = self.reference_modality(list(modalities))
        ref = modalities[ref_name][0].info
        if self.crs is not None or self.resolution is not None:
            target = TargetGrid.covering(ref, self.crs, self.resolution)
        else:
            target = TargetGrid.of(ref)
        flat: list[RasterSource] = []
        plans: list[ModalityContext] = []
        try:
            for m in given:
                part = self._parts[self.modalities.index(m)]
                aligned = aligned_modality(
                    m.name, modalities[m.name], target, m.resampling, threads
                )
                start = len(flat)
                flat.extend(aligned)
                try:
                    sub = part.prepare(aligned)
                except GeoServeError as exc:
                    raise prefixed(exc, f"modality {m.name!r}") from None
                plans.append(ModalityContext(m.name, start, len(flat), sub, m.num_frames))
        except BaseException:
            for src in flat:  # the warpers made so far (the caller closes the inputs)
                if isinstance(src, WarpedSource):
                    src.release()
            raise
        grid = PatchGrid(target.height, target.width, self.patch_size, self.stride, self.blend)
        ref_profile = modalities[ref_name][0].info.profile
        ctx = RasterContext(
            grid=grid,
            names=tuple(f"{p.name}={n}" for p in plans for n in p.ctx.names),
            bands=tuple(b for p in plans for b in p.ctx.bands),
            band_names=tuple(f"{p.name}:{n}" for p in plans for n in p.ctx.band_names),
            profile=target.profile({**ref_profile, "nodata": ref.nodata}),
            has_nodata=any(p.ctx.has_nodata for p in plans),
            modalities=tuple(plans),
        )
        return flat, ctx

    def check_names(self, modalities: Mapping[str, Sequence[Any]]) -> list[Modality]:
        """The declared modalities a request gives, once its names and dates are checked.

        ``modalities`` maps each name to its inputs (opened or not: only their number is
        looked at), so a request is refused before anything is opened.

        Raises:
            InputError: an unknown or missing modality, or a wrong number of dates.
        """
        unknown = [n for n in modalities if n not in self.names]
        if unknown:
            raise InputError(
                f"unknown modality {unknown[0]!r}; this model takes {', '.join(self.names)}"
            )
        missing = [m.name for m in self.modalities if m.required and m.name not in modalities]
        if missing:
            raise InputError(
                f"modality {missing[0]!r} is missing; this model needs "
                f"{', '.join(m.name for m in self.modalities if m.required)}"
                + self._optional_note()
            )
        given = [m for m in self.modalities if m.name in modalities]
        for m in given:
            if len(modalities[m.name]) != m.num_frames:
                raise InputError(
                    f"modality {m.name!r}: {len(modalities[m.name])} date(s) given; the model "
                    f"takes {m.num_frames}"
                )
        return given

    def _optional_note(self) -> str:
        optional = [m.name for m in self.modalities if not m.required]
        return f" (optional: {', '.join(optional)})" if optional else ""

    def read_row(self, sources: Sequence[RasterSource], ctx: RasterContext, row: int) -> PatchRow:
        """Read grid row ``row`` of every modality and cut it into one dict of patches."""
        return self.cut_row(self.fetch_row(sources, ctx, row), ctx, row)

    def fetch_row(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        device: torch.device | None = None,
    ) -> list[NDArray[Any]]:
        """Each modality's raw rows under grid row ``row`` (see :meth:`GeoTiffPatcher.fetch_raw`).

        Multimodal patches are cut on the host (``device`` is not used).
        """
        return [
            self._parts[self.names.index(plan.name)].fetch_raw(
                sources[plan.start : plan.stop], plan.ctx, row
            )
            for plan in ctx.modalities
        ]

    def cut_row(
        self,
        fetched: list[NDArray[Any]],
        ctx: RasterContext,
        row: int,
        device: torch.device | None = None,
    ) -> PatchRow:
        """Normalise and cut each modality's raw rows into one dict of patches (on the host)."""
        grid = ctx.grid
        p, s = grid.patch_size, grid.stride
        required = {m.name for m in self.modalities if m.required}
        datas: dict[str, NDArray[np.float32]] = {}
        wide_bad: list[NDArray[np.bool_]] = []  # per modality, (P, padded width)
        core_ok: list[NDArray[np.bool_]] = []  # per modality, (core rows, width)
        any_required = any(plan.name in required for plan in ctx.modalities)
        core_h = grid.core_window(row, 0).height
        span = (grid.cols - 1) * s + p
        for plan, raw in zip(ctx.modalities, fetched, strict=True):
            part = self._parts[self.names.index(plan.name)]
            band = part.band_of(raw, plan.ctx, row)
            data = part.normalize(band.raw)
            if band.invalid is not None:
                data[..., band.invalid] = part.fill
            datas[plan.name] = data
            if any_required and plan.name not in required:
                continue  # an optional modality's gaps are filled, not masked
            bad = band.invalid if band.invalid is not None else np.zeros((p, span), bool)
            ok = (
                band.core_valid
                if band.core_valid is not None
                else np.ones((core_h, grid.width), bool)
            )
            wide_bad.append(bad)
            core_ok.append(ok)
        if any_required:  # nodata in any required modality
            bad = np.logical_or.reduce(wide_bad)
            ok = np.logical_and.reduce(core_ok)
        else:  # nodata where every modality given is
            bad = np.logical_and.reduce(wide_bad)
            ok = np.logical_or.reduce(core_ok)
        cols = tuple(c for c in range(grid.cols) if not bad[:, c * s : c * s + p].all())
        patches: dict[str, Patches] = {}
        for name, data in datas.items():
            windows = sliding_window_view(data, p, axis=-1)[..., ::s, :]
            cut = np.moveaxis(windows, -2, 0)  # (cols, C, [T,] P, P), a view
            patches[name] = cut[list(cols)] if len(cols) < grid.cols else cut
        return PatchRow(row=row, cols=cols, patches=patches, core_valid=None if ok.all() else ok)

    def dummy_input(self, seed: int = 0) -> RasterArray:
        """The first modality's dummy input."""
        return self._parts[0].dummy_input(seed)

    def dummy_request(self, seed: int = 0) -> Mapping[str, Any]:
        """One seeded dummy raster per modality (all of them, optional ones too), one grid."""
        out: dict[str, Any] = {}
        for i, (m, part) in enumerate(zip(self.modalities, self._parts, strict=True)):
            out[m.name] = [part.dummy_input(seed + i)] * m.num_frames
        return out

    @property
    def in_channels(self) -> int | None:
        """The first modality's band count, when fixed.

        (A multimodal model is checked by its warm-up on :meth:`dummy_request`.)
        """
        return self._parts[0].in_channels
