"""Admission: a request's inputs opened and checked, and its :class:`Request` built.

Nothing here reads a pixel: each input is opened (headers only, through the allowed drivers),
the input processor plans the request (:meth:`InputProcessor.prepare`: bands, dates, grid,
model arguments), the output sink is made, and the size guards of
:mod:`geoserve.engine.limits` run. :class:`Admission` holds the :class:`Engine` methods that
do it (``prepare_request``, ``admit``, ``add_request``); ``Engine`` derives from it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from geoserve.config import EngineConfig
from geoserve.engine.limits import check_request, warn_if_disk_short
from geoserve.engine.products import (
    Product,
    kinds_offered,
    output_processors,
    product_sink,
)
from geoserve.engine.request import Request
from geoserve.engine.scheduler import Scheduler
from geoserve.engine.stac_inputs import StacPlan, stac_processor
from geoserve.errors import (
    BandMismatchError,
    ConfigError,
    GeoServeError,
    InputError,
    prefixed,
)
from geoserve.processors.base import InputProcessor, OutputProcessor, RasterContext
from geoserve.processors.embeddings import token_grid
from geoserve.raster.budget import add_pixels
from geoserve.raster.dates import DateLike, request_dates
from geoserve.raster.sinks import OutputSink, product_paths
from geoserve.raster.source import DataFormat, RasterLike, RasterSource, open_raster
from geoserve.raster.stac_item import is_stac_input
from geoserve.registry import ModelSpec
from geoserve.schemas import (
    OUT_FORMATS,
    TOKEN_KINDS,
    ImageRequestOutput,
    OutFormat,
)

if TYPE_CHECKING:
    import torch

#: One request's input: a raster, the dates of one place, or modalities by name (a dict whose
#: values are a raster or a list of dates).
ImageInput = RasterLike | Sequence[RasterLike] | Mapping[str, RasterLike | Sequence[RasterLike]]


def modality_items(
    inputs: Mapping[Any, Any], dates: Any
) -> tuple[dict[str, list[RasterLike]], dict[str, Any] | None]:
    """A dict request's modalities, each as its list of dates, and their explicit dates.

    ``dates`` is None or a mapping of modality name to its dates (as for a list request).

    Raises:
        InputError: naming the modality or field at fault.
    """
    if not inputs:
        raise InputError("an empty dict of modalities; give at least one modality")
    items: dict[str, list[RasterLike]] = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"modality names must be non-empty strings, got {name!r}")
        items[name] = list(value) if isinstance(value, list | tuple) else [value]
        if not items[name]:
            raise InputError(f"modality {name!r}: an empty list of inputs")
    if dates is None:
        return items, None
    if not isinstance(dates, Mapping):
        raise InputError("dates: give a dict of modality name to dates for a dict of modalities")
    when: dict[str, Any] = {}
    for name, value in dates.items():
        if name not in items:
            raise InputError(f"dates: no modality {name!r} in the request")
        when[name] = request_dates(value, len(items[name]), f"dates[{name!r}]")
    return items, when


def _count_pixels(src: RasterSource, plan: StacPlan | None) -> None:
    """Count a plain file's pixels to the request's budget: the bands the request reads of it.

    Not counted where that is not known before the processor plans the request (a modality
    stacked with others may give it any number of bands, or none): the request's own size
    check, once everything is open, still counts it.
    """
    if plan is None or plan.partial:
        return
    info = src.info
    bands = info.count if plan.selectors is None else len(plan.selectors)
    add_pixels(info.name, info.width * info.height * bands)


class Admission:
    """The admission half of :class:`Engine`; the attributes below are the engine's."""

    spec: ModelSpec
    in_proc: InputProcessor
    out_proc: OutputProcessor
    out_procs: tuple[OutputProcessor, ...]
    _model_out_proc: OutputProcessor  # the model's own, whatever kinds the engine makes
    device: torch.device
    preprocess: str
    config: EngineConfig
    read_workers: int
    max_request_bytes: int | None
    scheduler: Scheduler
    _output_dir: Path | None
    _reader: Executor | None

    @property
    def output_dir(self) -> Path:
        """Directory for outputs without an explicit path (a temporary one by default)."""
        if self._output_dir is None:
            self._output_dir = Path(tempfile.mkdtemp(prefix="geoserve-"))
        return self._output_dir

    def _open(
        self,
        item: RasterLike,
        data_format: DataFormat,
        date: dt.date | None,
        stac: StacPlan | None = None,
    ) -> RasterSource:
        """One input opened through the allowed drivers (headers only).

        A STAC Item (``stac``: which of its bands) becomes one stack of the files it names.
        Each file's pixels count to the request's budget as soon as its header is read
        (:func:`geoserve.raster.budget.add_pixels`; an Item's files as each is opened).
        """
        kw: dict[str, Any] = {"threads": self.read_workers, "formats": self.config.allowed_formats}
        # an Item by its form (a URL's path, a local file's first bytes: a JSON object),
        # decided before anything is opened as a raster
        if stac is not None and is_stac_input(item, data_format):
            src: RasterSource = stac.open(item, kw)
        else:
            src = open_raster(item, data_format, **kw)
            try:
                _count_pixels(src, stac)
            except BaseException:
                src.close()
                raise
        if date is not None:  # given: wins over tags and name
            src.info = dataclasses.replace(src.info, date=date)
        return src

    def _open_modalities(
        self,
        inputs: Mapping[str, Sequence[RasterLike]],
        data_format: DataFormat,
        dates: Any,
        proc: InputProcessor,
        opened: list[RasterSource],
    ) -> dict[str, list[RasterSource]]:
        """A dict request's inputs opened, by modality (each also appended to ``opened``)."""
        proc.check_names(inputs)  # names and dates, before anything is opened
        by_name: dict[str, list[RasterSource]] = {}
        for name, items in inputs.items():
            when = dates.get(name) if isinstance(dates, Mapping) else None
            plan = StacPlan.of(proc, name)
            by_name[name] = []
            for i, item in enumerate(items):
                try:
                    src = self._open(item, data_format, when[i] if when else None, plan)
                except GeoServeError as exc:
                    raise prefixed(exc, f"modality {name!r}") from None
                opened.append(src)
                by_name[name].append(src)
        return by_name

    def _new_request(
        self,
        inputs: Sequence[RasterLike] | Mapping[str, Sequence[RasterLike]],
        request_id: str,
        out_format: OutFormat,
        output_path: Path | None,
        data_format: DataFormat = "auto",
        in_proc: InputProcessor | None = None,
        out_procs: Sequence[OutputProcessor] | None = None,
        priority: int = 0,
        dates: Sequence[dt.date | None]
        | Mapping[str, Sequence[dt.date | None] | None]
        | None = None,
        kind: Callable[..., Request] = Request,
    ) -> Request:
        """Open and check the inputs and build the request (``kind``: its type).

        ``inputs`` is the dates of one place, or a mapping of modality name to its dates;
        ``out_procs`` one output processor per output kind (default: the engine's).
        """
        proc = in_proc or self.in_proc
        procs = list(out_procs or self.out_procs)
        opened: list[RasterSource] = []
        sinks: list[OutputSink] = []
        try:
            proc = stac_processor(proc, inputs, data_format)
            sources, ctx = self._plan(proc, inputs, data_format, dates, opened)
            kinds = [getattr(p, "kind", "raw") for p in procs]
            if set(kinds) & set(TOKEN_KINDS) and self.spec.token_size:
                token_grid(ctx.grid, self.spec.token_size)  # refused unless on token edges
            paths: list[Path | None] = [None] * len(procs)
            if out_format == "path":
                named = output_path is not None
                base = output_path or self.output_dir / f"{request_id}.tif"
                fmt = self.config.polygon_format
                paths = list(product_paths(base, kinds, named=named, polygon_format=fmt))
            for out_proc, path in zip(procs, paths, strict=True):
                sinks.append(product_sink(self.spec, self.config, out_proc, out_format, path, ctx))
        except BaseException as exc:
            for sink in sinks:
                sink.abort()
            for src in opened:
                src.close()
            if isinstance(exc, BandMismatchError):
                raise self._with_bands_hint(exc, proc) from exc
            raise
        more = tuple(
            Product(k, p, s) for k, p, s in zip(kinds[1:], procs[1:], sinks[1:], strict=True)
        )
        req = kind(
            request_id,
            sources,
            ctx,
            proc,
            procs[0],
            out_format,
            output_path,
            sink=sinks[0],
            reader=self._reader,
            prefetch_rows=self.config.prefetch_rows,
            parallel_rows=min(self.config.prefetch_rows, self.read_workers),
            cut_on=self.device if self.preprocess == "device" else None,
            stitch_on=self._stitch_device(procs),
            priority=priority,
            more_outputs=more,
            token_size=self.spec.token_size if set(kinds) & set(TOKEN_KINDS) else None,
        )
        try:
            check_request(req, self.config.max_patches, self.max_request_bytes)
            if paths[0] is not None:
                warn_if_disk_short(paths[0], req)
        except BaseException:
            req.close()
            raise
        return req

    def _plan(
        self,
        proc: InputProcessor,
        inputs: Sequence[RasterLike] | Mapping[str, Sequence[RasterLike]],
        data_format: DataFormat,
        dates: Any,
        opened: list[RasterSource],
    ) -> tuple[Sequence[RasterSource], RasterContext]:
        """Open ``inputs`` (appending each to ``opened``) and let ``proc`` plan the request."""
        if isinstance(inputs, Mapping):
            by_name = self._open_modalities(inputs, data_format, dates, proc, opened)
            return proc.prepare_modalities(by_name, self.read_workers)
        plan = StacPlan.of(proc)
        for i, item in enumerate(inputs):
            when_i = dates[i] if isinstance(dates, Sequence) else None
            opened.append(self._open(item, data_format, when_i, plan))
        return opened, proc.prepare(opened)

    def _with_bands_hint(self, exc: BandMismatchError, proc: InputProcessor) -> BandMismatchError:
        """``exc`` with what the model takes, the bands it reads and how to choose others."""
        wanted = getattr(proc, "bands", None)
        names = getattr(proc, "names", None)  # a multimodal model's modalities
        if names and not str(exc).startswith(f"modality {names[0]!r}"):
            wanted = None  # --bands selects the first modality's bands only
        takes = self.spec.input_description
        if not (wanted or takes):
            return exc
        parts = [f"takes {takes}"] if takes else []
        if wanted:
            numbered = any(isinstance(b, int) for b in wanted)  # indices, as --bands takes
            parts.append(
                f"reads bands {', '.join(map(str, wanted))}{' (0-based)' if numbered else ''} "
                "(choose others with --bands on the command line, bands= in Python or "
                "options.bands over HTTP)"
            )
        return BandMismatchError(f"{exc}; model {self.spec.name!r} " + "; it ".join(parts))

    def _stitch_device(self, out_procs: Sequence[OutputProcessor]) -> torch.device | None:
        """Where a request's canvas lives: on the device with ``preprocess="device"``.

        Not when an output processor hooks into each patch (``prepare_patch`` takes numpy).
        """
        if self.preprocess != "device":
            return None
        for out_proc in out_procs:
            hook = getattr(type(out_proc), "prepare_patch", None)
            if hook is not OutputProcessor.prepare_patch:
                return None
        return self.device

    def prepare_request(
        self,
        inputs: ImageInput,
        *,
        request_id: str | None = None,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        bands: Sequence[int | str] | None = None,
        output_kind: str | Sequence[str] | None = None,
        priority: int = 0,
        dates: DateLike | Sequence[DateLike] | None = None,
    ) -> Request:
        """Open and check one request's inputs (headers only, no pixels) without admitting it.

        Safe to call from any thread: it reads the engine's configuration and nothing else.
        ``bands`` and ``output_kind`` override the model's defaults for this request only
        (``output_kind``: one kind, or several from the same model pass, see
        :meth:`Engine.output_processors`).
        ``dates`` gives the acquisition date of each input (ISO strings, ``date`` or
        ``datetime`` objects, one per input; ``None`` for one: from its tags or file name),
        for models that take dates; they win over the inputs' tags and file names.

        Raises:
            GeoServeError: a subclass naming the file, band or field at fault.
        """
        if out_format not in OUT_FORMATS:
            raise ConfigError(
                f"invalid out_format {out_format!r}; choose one of {', '.join(OUT_FORMATS)}"
            )
        items: list[RasterLike] | dict[str, list[RasterLike]]
        when: Any
        if isinstance(inputs, Mapping):
            items, when = modality_items(inputs, dates)
        else:
            items = cast(
                list[RasterLike], list(inputs) if isinstance(inputs, list | tuple) else [inputs]
            )
            when = request_dates(dates, len(items))
        in_proc = self.in_proc.replace(bands=tuple(bands)) if bands is not None else None
        out_procs = self.output_processors(output_kind) if output_kind else None
        path = Path(output_path) if output_path is not None else None
        rid = request_id or uuid.uuid4().hex[:12]
        return self._new_request(
            items,
            rid,
            out_format,
            path,
            data_format,
            in_proc,
            out_procs,
            priority=priority,
            dates=when,
        )

    @property
    def model_out_proc(self) -> OutputProcessor:
        """The model's own output processor (its classes and colours), whatever kinds are run."""
        return self._model_out_proc

    def kinds_offered(self) -> tuple[str, ...]:
        """Every output kind this model can produce (see :mod:`geoserve.engine.products`)."""
        return kinds_offered(self.spec, self._model_out_proc)

    def output_processors(self, kinds: str | Sequence[str]) -> tuple[OutputProcessor, ...]:
        """The model's output processor for each of ``kinds`` (text: comma-separated).

        Raises:
            ConfigError: an unknown kind, a kind this model cannot produce (naming the ones it
                can), a kind asked twice, or no kind.
        """
        model = getattr(self, "model", None)
        return output_processors(self.spec, self._model_out_proc, kinds, self.config, model)

    def admit(self, request: Request) -> None:
        """Queue a prepared request: lower ``priority`` first, then arrival order."""
        self.scheduler.admit(request)

    def add_request(
        self,
        inputs: ImageInput,
        *,
        request_id: str | None = None,
        output_path: str | Path | None = None,
        out_format: OutFormat = "path",
        data_format: DataFormat = "auto",
        priority: int = 0,
        dates: DateLike | Sequence[DateLike] | None = None,
    ) -> str:
        """Admit one request; its patches join the next batches. Returns the request id.

        ``inputs`` is one raster, or a list of rasters as the dates of one place; ``dates``
        their acquisition dates, as for :meth:`prepare_request`. A request whose input cannot
        be opened is not raised here: it comes back, failed, from the next :meth:`step`.
        """
        rid = request_id or uuid.uuid4().hex[:12]
        try:
            req = self.prepare_request(
                inputs,
                request_id=rid,
                output_path=output_path,
                out_format=out_format,
                data_format=data_format,
                priority=priority,
                dates=dates,
            )
        except GeoServeError as exc:
            self.scheduler.failed.append(ImageRequestOutput(rid, finished=True, error=exc))
            return rid
        self.admit(req)
        return rid
