"""Admission: a request's inputs opened and checked, and its :class:`Request` built.

Nothing here reads a pixel: the :class:`~geoserve.engine.request_spec.RequestSpec` is checked
against the model, each input is opened (headers only, through the allowed drivers), the input
processor plans the request (:meth:`InputProcessor.prepare`: bands, dates, grid, model
arguments), the output sinks are made, and the size guards of :mod:`geoserve.engine.limits`
run. :class:`Admission` is the part of an :class:`Engine` that does it, given what it needs at
start-up; ``Engine.prepare_request`` and ``Engine.add_request`` delegate to it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from geoserve.config import EngineConfig
from geoserve.engine.batch import Patch
from geoserve.engine.limits import check_request, warn_if_disk_short
from geoserve.engine.products import Product, product_sink
from geoserve.engine.request import Request
from geoserve.engine.request_spec import RequestSpec
from geoserve.engine.stac_inputs import StacPlan, open_search, stac_processor
from geoserve.engine.tensor_request import tensor_patcher, tensor_spec
from geoserve.errors import BandMismatchError, ConfigError, GeoServeError, prefixed
from geoserve.processors.base import InputProcessor, OutputProcessor, RasterContext
from geoserve.processors.embeddings import token_grid
from geoserve.raster.budget import add_pixels
from geoserve.raster.sinks import OutputSink, product_paths
from geoserve.raster.source import DataFormat, RasterLike, RasterSource, open_raster
from geoserve.raster.stac_item import is_stac_input
from geoserve.registry import ModelSpec
from geoserve.schemas import TOKEN_KINDS
from geoserve.stac_query import StacSearch

if TYPE_CHECKING:
    import torch

#: The output processors of some output kinds (``Engine.output_processors``).
KindProcessors = Callable[[str | Sequence[str]], tuple[OutputProcessor, ...]]


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


@dataclass(kw_only=True)
class Admission:
    """Opens and checks requests for one engine (see the module docstring).

    Attributes:
        spec: The model's registration (name, token size, what it takes).
        config: The engine's options (allowed formats, prefetch rows, polygon format, limits).
        in_proc: The engine's input processor.
        out_procs: The engine's output processors, one per output kind it makes by default.
        tensor_procs: The output processor of tensor requests (warm-up and
            ``Engine.transform``: :func:`~geoserve.engine.tensor_request.tensor_procs`).
        output_processors: The output processors of other kinds, for a request that asks
            for them (``Engine.output_processors``: its messages name the kinds offered).
        device: The model's device.
        preprocess: ``device`` (rows cut on the model's device) or ``host``.
        read_workers: Reader threads (GDAL's decoding threads for each input).
        max_request_bytes: The memory bound of one request (None: none).
        reader: The engine's reader pool, where requests read their rows ahead (None: each
            row is read when it is needed; :meth:`close` sets it so).
        output_dir: Where outputs without a path go (None: a temporary directory, made when
            first needed: :meth:`default_dir`).
        request_kwargs: A request's generation options -> the per-request model arguments
            they become (``SteppedModel.request_kwargs``); None: the model takes none, and a
            request that sets one is refused.
    """

    spec: ModelSpec
    config: EngineConfig
    in_proc: InputProcessor
    out_procs: tuple[OutputProcessor, ...]
    tensor_procs: tuple[OutputProcessor, ...]
    output_processors: KindProcessors
    device: torch.device
    preprocess: str
    read_workers: int
    max_request_bytes: int | None
    reader: Executor | None
    output_dir: Path | None = None
    request_kwargs: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None

    def close(self) -> None:
        """Forget the reader pool (the engine shuts it down): later requests read in place."""
        self.reader = None

    def default_dir(self) -> Path:
        """Directory for outputs without an explicit path (a temporary one unless given)."""
        if self.output_dir is None:
            self.output_dir = Path(tempfile.mkdtemp(prefix="geoserve-"))
        return self.output_dir

    def prepare(self, spec: RequestSpec) -> Request:
        """Check ``spec``, open its inputs (headers only, no pixels) and build its request.

        Safe to call from any thread: it reads the engine's configuration and nothing else.

        Raises:
            GeoServeError: a subclass naming the file, band or field at fault.
        """
        if not isinstance(spec, RequestSpec):
            raise TypeError(f"prepare_request takes a RequestSpec, not {type(spec).__name__}")
        spec = spec.check(self)
        bands, kinds = spec.bands, spec.output_kind
        in_proc = self.in_proc.replace(bands=bands) if bands is not None else None
        out_procs = self.output_processors(kinds) if kinds is not None else None
        if spec.request_id is None:
            spec = dataclasses.replace(spec, request_id=uuid.uuid4().hex[:12])
        return self.new_request(spec, in_proc, out_procs)

    def warmup_patch(self, tokens: bool) -> Patch:
        """One patch of the input processor's dummy input (for warm-up; ``tokens``: theirs too)."""
        dummy = RequestSpec(self.in_proc.dummy_request(seed=0), "warmup", out_format="tensor")
        req = self.new_request(dummy.normalised(), out_procs=self.tensor_procs, tokens=tokens)
        patch = req.pop_patch()
        req.close()
        assert patch is not None  # dummy inputs have no nodata
        return patch

    def tensor_request(self, i: int, tensor: torch.Tensor, request_id: str) -> Request:
        """Tensor ``i`` of ``Engine.transform`` as a request: the engine's grid, no value changed.

        Raises:
            GeoServeError: the tensor's shape, or the size guards.
        """
        spec, kind = tensor_spec(i, tensor, request_id)
        proc = tensor_patcher(self.in_proc)
        return self.new_request(spec, proc, self.tensor_procs, kind=kind)

    def new_request(
        self,
        spec: RequestSpec,
        in_proc: InputProcessor | None = None,
        out_procs: Sequence[OutputProcessor] | None = None,
        *,
        kind: Callable[..., Request] = Request,
        tokens: bool = False,
    ) -> Request:
        """Open and check a normalised spec's inputs and build its request (``kind``: its type).

        ``in_proc`` and ``out_procs`` (one output processor per output kind) default to the
        engine's; ``tokens``: the request carries the model's token size whatever its kinds
        (warm-up of a model's tokens).
        """
        inputs = cast(Sequence[RasterLike] | Mapping[str, Sequence[RasterLike]], spec.inputs)
        rid = spec.request_id or uuid.uuid4().hex[:12]
        output_path = cast(Path | None, spec.output_path)
        proc = in_proc or self.in_proc
        procs = list(out_procs or self.out_procs)
        opened: list[RasterSource] = []
        sinks: list[OutputSink] = []
        try:
            proc = stac_processor(proc, inputs, spec.data_format)
            dates = spec.dates
            if not isinstance(inputs, Mapping) and any(isinstance(x, StacSearch) for x in inputs):
                kw = {"threads": self.read_workers, "formats": self.config.allowed_formats}
                inputs, dates = open_search(proc, inputs, kw), None  # (its dates: the days read)
            sources, ctx = self._plan(proc, inputs, spec.data_format, dates, opened)
            ctx = self._with_generation(ctx, spec.generation)
            kinds = [getattr(p, "kind", "raw") for p in procs]
            if set(kinds) & set(TOKEN_KINDS) and self.spec.token_size:
                token_grid(ctx.grid, self.spec.token_size)  # refused unless on token edges
            paths: list[Path | None] = [None] * len(procs)
            if spec.out_format == "path":
                named = output_path is not None
                base = output_path or self.default_dir() / f"{rid}.tif"
                fmt = self.config.polygon_format
                paths = list(product_paths(base, kinds, named=named, polygon_format=fmt))
            for out_proc, path in zip(procs, paths, strict=True):
                sinks.append(
                    product_sink(self.spec, self.config, out_proc, spec.out_format, path, ctx)
                )
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
        wants_tokens = tokens or bool(set(kinds) & set(TOKEN_KINDS))
        req = kind(
            rid,
            sources,
            ctx,
            proc,
            procs[0],
            spec.out_format,
            output_path,
            sink=sinks[0],
            reader=self.reader,
            prefetch_rows=self.config.prefetch_rows,
            parallel_rows=min(self.config.prefetch_rows, self.read_workers),
            cut_on=self.device if self.preprocess == "device" else None,
            stitch_on=self._stitch_device(procs),
            priority=spec.priority,
            seed=spec.seed,
            more_outputs=more,
            token_size=self.spec.token_size if wants_tokens else None,
            patch_keys=spec.patch_keys,
        )
        try:
            check_request(req, self.config.max_patches, self.max_request_bytes)
            if paths[0] is not None:
                warn_if_disk_short(paths[0], req)
        except BaseException:
            req.close()
            raise
        return req

    def _with_generation(self, ctx: RasterContext, options: Mapping[str, Any]) -> RasterContext:
        """``ctx`` carrying the model arguments of the request's generation options."""
        if self.request_kwargs is None:
            if options:
                raise ConfigError(
                    f"model {self.spec.name!r} does not generate: {', '.join(options)} "
                    "(generation options) are for generative models only"
                )
            return ctx
        extra = self.request_kwargs(options)
        return dataclasses.replace(ctx, model_kwargs={**ctx.model_kwargs, **extra})

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
