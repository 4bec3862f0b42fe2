"""The two processor interfaces every model needs, and the per-request values they exchange.

An *input processor* turns request inputs into normalised patches; an *output processor* turns
blended model outputs back into a raster. Processor instances hold configuration only and are
shared by all requests: everything that belongs to one request lives in the frozen
:class:`RasterContext` returned by :meth:`InputProcessor.prepare`, or in the engine's request
object.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.raster.align import stack_modalities
from geoserve.raster.grid import PatchGrid
from geoserve.raster.source import RasterArray, RasterInfo, RasterLike, RasterSource
from geoserve.raster.write import OutputRaster
from geoserve.schemas import OUTPUT_KINDS as OUTPUT_KINDS
from geoserve.schemas import OutputKind as OutputKind

P = TypeVar("P", bound="Configurable")

#: One model input: (C, P, P) or (C, T, P, P) patches (or a batch of them), numpy or torch.
Patches: TypeAlias = NDArray[np.float32] | torch.Tensor
#: What a model takes: one array, or one per modality (a multimodal model).
ModelInput: TypeAlias = Patches | Mapping[str, Patches]
#: Opened inputs by modality name, each the dates of that modality (one for most).
Modalities: TypeAlias = Mapping[str, Sequence[RasterSource]]


class Configurable:
    """Mixin for frozen-dataclass processors: copies with some fields replaced, re-validated."""

    def replace(self: P, **changes: Any) -> P:
        """Return a copy with ``changes`` applied (``None`` values are ignored)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore[type-var]


@dataclass(frozen=True)
class RasterContext:
    """Everything one request's processors need to know about its input; frozen.

    Attributes:
        grid: Patch placement for this image.
        names: The input names (path or ``<bytes>``), one per date.
        bands: 0-based indices of the bands fed to the model.
        band_names: Their descriptions (or ``band_<n>``), for output band descriptions.
        profile: The first input's rasterio profile: the output grid is copied from it.
        has_nodata: Whether the output declares a nodata value: the input declares one, or
            its float bands may hold NaN. Decided before any pixel is read, so every band of
            output rows carries the same metadata however the scene is streamed.
        model_kwargs: Extra per-request model arguments as arrays without the batch axis
            (``temporal_coords`` (T, 2), ``location_coords`` (2,)); empty for most models.
    """

    grid: PatchGrid
    names: tuple[str, ...]
    bands: tuple[int, ...]
    band_names: tuple[str, ...]
    profile: Mapping[str, Any]
    has_nodata: bool
    model_kwargs: Mapping[str, NDArray[np.float32]] = dataclasses.field(default_factory=dict)
    modalities: tuple[ModalityContext, ...] = ()
    """For a multimodal model, each modality's own plan (empty otherwise)."""
    dtypes: tuple[str, ...] = ()
    """Each date's data type, when the dates differ in it (their nodata is matched in each
    date's own type, though the row holds them in a common one); empty otherwise."""

    @property
    def input_values(self) -> int:
        """Values the model reads per pixel: bands x dates, over every modality."""
        if self.modalities:
            return sum(m.ctx.input_values for m in self.modalities)
        return len(self.bands) * len(self.names)

    def patch_shape(self, p: int, frames: int) -> Any:
        """The shape of one model input: (C, P, P), or (C, T, P, P) for ``frames`` > 1.

        For a multimodal model, a tuple of (modality, shape) pairs.
        """
        if self.modalities:
            return tuple((m.name, m.ctx.patch_shape(p, m.frames)) for m in self.modalities)
        if frames > 1:
            return (len(self.bands), frames, p, p)
        return (len(self.bands), p, p)


@dataclass(frozen=True)
class ModalityContext:
    """One modality of a multimodal request, as planned by its input processor.

    Attributes:
        name: The modality's name (the key of the model's input dict).
        start, stop: Its sources among the request's (one per date).
        ctx: Its own plan: bands, nodata and names on the request's grid.
        frames: Its dates per request (> 1 gives (C, T, P, P) patches).
    """

    name: str
    start: int
    stop: int
    ctx: RasterContext
    frames: int = 1


@dataclass(frozen=True)
class PatchRow:
    """The patches of one grid row, ready for the model.

    Attributes:
        row: Grid row index.
        cols: Grid column of each patch in ``patches`` (all-nodata patches are left out).
        patches: float32 (len(cols), C, P, P), or (len(cols), C, T, P, P) for T dates: a numpy
            array, or a torch tensor already on the model's device when it was cut there; for
            a multimodal model, one such array per modality (a dict).
        core_valid: (core height, width) bool mask of valid input pixels in this row's core
            rows, or ``None`` when every pixel is valid.
    """

    row: int
    cols: tuple[int, ...]
    patches: ModelInput
    core_valid: NDArray[np.bool_] | None


class InputProcessor(ABC, Configurable):
    """Cuts request inputs into normalised model patches.

    Subclasses are frozen dataclasses that define at least ``patch_size``, ``stride``,
    ``blend`` and ``num_frames``.
    """

    patch_size: int
    stride: int
    blend: str
    num_frames: int

    @abstractmethod
    def prepare(self, sources: Sequence[RasterSource]) -> RasterContext:
        """Check the inputs against this processor's needs and plan the patch grid.

        Raises:
            GeoServeError: a subclass naming the file, band or field at fault.
        """

    def prepare_modalities(
        self, modalities: Modalities, threads: int = 1
    ) -> tuple[list[RasterSource], RasterContext]:
        """Plan a request given as several modalities (a dict); returns what to read and how.

        By default the modalities become one stack of bands, in the dict's order, on the
        first modality's grid, resampled bilinearly (every band keeps its own nodata), and
        :meth:`prepare` plans that stack like any single input. A multimodal processor
        (:class:`~geoserve.processors.multimodal.MultimodalPatcher`) overrides it.

        Raises:
            GeoServeError: a subclass naming the modality, file, band or field at fault.
        """
        stacks = stack_modalities(modalities, threads)
        return stacks, self.prepare(stacks)

    def check_names(self, modalities: Mapping[str, Sequence[Any]]) -> Any:
        """Refuse a dict request whose modality names or dates do not fit, before opening it.

        Any names fit a processor that stacks the modalities (the default).
        """
        return None

    def reference_modality(self, names: Sequence[str]) -> str:
        """Which of a request's modalities ``names`` gives the grid (by default the first)."""
        return names[0]

    def resampling_of(self, modality: str) -> str:
        """How ``modality`` is put on the reference grid (bilinear by default)."""
        return "bilinear"

    def band_selectors(self, modality: str | None = None) -> Sequence[int | str] | None:
        """The bands this processor reads (of ``modality``, for a multimodal one); None: all.

        Used to pick the assets of a STAC Item input.
        """
        return getattr(self, "bands", None)

    def dummy_request(self, seed: int = 0) -> Sequence[RasterLike] | Mapping[str, Any]:
        """A tiny synthetic request this processor accepts (for warm-up): its dates."""
        return [self.dummy_input(seed)] * self.num_frames

    @abstractmethod
    def read_row(self, sources: Sequence[RasterSource], ctx: RasterContext, row: int) -> PatchRow:
        """Read and normalise the patches of grid row ``row``."""

    def read_row_on(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        device: torch.device,
    ) -> PatchRow:
        """:meth:`read_row`, cutting the patches on ``device`` where this processor can.

        The engine calls it with ``preprocess="device"``. By default the patches are cut on
        the host (numpy, as :meth:`read_row`), which the engine takes as well; a processor
        that can cast, normalise and cut in torch overrides it.
        """
        return self.read_row(sources, ctx, row)

    def fetch_row(
        self,
        sources: Sequence[RasterSource],
        ctx: RasterContext,
        row: int,
        device: torch.device | None = None,
    ) -> Any:
        """The part of reading grid row ``row`` that touches the sources (see :meth:`cut_row`).

        The engine calls it for a request's rows one at a time, in row order (sources are not
        thread-safe, and they cache decoded blocks between neighbouring rows), then
        :meth:`cut_row` on what it returned, on the same thread; the cuts of several rows of
        one request may run at once on different threads. So what it returns must not refer
        to the sources' buffers (:meth:`RasterSource.read_rows` returns a view valid until the
        next read). ``device``: as :meth:`read_row_on` (None: on the host).

        By default it is the whole of :meth:`read_row` (or :meth:`read_row_on`), and
        :meth:`cut_row` hands it on; a processor whose cutting is costly splits the two.
        """
        if device is None:
            return self.read_row(sources, ctx, row)
        return self.read_row_on(sources, ctx, row, device)

    def cut_row(
        self, fetched: Any, ctx: RasterContext, row: int, device: torch.device | None = None
    ) -> PatchRow:
        """The patches of grid row ``row`` from what :meth:`fetch_row` gave (by default, them)."""
        patches: PatchRow = fetched
        return patches

    @abstractmethod
    def dummy_input(self, seed: int = 0) -> RasterArray:
        """A tiny synthetic raster this processor accepts (for warm-up and tests)."""

    @property
    def in_channels(self) -> int | None:
        """Number of bands fed to the model, if fixed by the configuration."""
        return None

    def band_roles_for(self, info: RasterInfo) -> Mapping[int, str]:
        """What the bands of ``info`` the model reads are (``"RED"``, ...), by 0-based index.

        For pictures only (the CLI's quicklook); none by default.
        """
        return {}


class OutputProcessor(ABC, Configurable):
    """Turns blended model outputs (C, H, W) into the output raster."""

    kind: OutputKind

    @property
    def out_channels(self) -> int | None:
        """Number of channels the model must return, if fixed by the configuration."""
        return None

    def prepare_patch(self, patch: NDArray[np.float32]) -> NDArray[np.float32]:
        """Hook applied to each output patch (C, P, P) before blending; no-op by default."""
        return patch

    def reduce_rows(self, blended: torch.Tensor) -> torch.Tensor:
        """The per-pixel part of :meth:`finalize`, in torch, on the device; identity by default.

        Runs where rows were stitched on the device, before they are copied back. An
        override must leave :meth:`finalize` able to take both its result and unreduced rows
        (from a host canvas), giving the same output for both.
        """
        return blended

    @abstractmethod
    def finalize(
        self,
        blended: NDArray[np.float32],
        valid: NDArray[np.bool_] | None,
        ctx: RasterContext,
    ) -> OutputRaster:
        """Turn the blended (C, H, W) output into the output raster.

        ``valid`` is the (H, W) mask of valid input pixels, or ``None`` when all are valid;
        invalid pixels must get the output's nodata value. With streaming, ``blended`` is one
        band of finished rows (H is the band's height), so the result must be per pixel and
        its metadata must depend on ``ctx`` only, never on the band's values.
        """

    def fitted(self, model: Any) -> OutputProcessor:
        """The processor fitted to the built model; itself by default.

        E.g. to what a generative model was configured to generate. Called once at start-up.
        """
        return self

    @abstractmethod
    def for_kind(self, kind: str) -> OutputProcessor:
        """A variant of this processor producing ``kind`` output.

        Raises:
            ConfigError: if this model's output cannot be turned into ``kind``.
        """
