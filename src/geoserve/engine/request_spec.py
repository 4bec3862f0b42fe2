"""A request as one value: :class:`RequestSpec`, which every front builds and admission takes.

A request is its inputs (one raster, the dates of one place, or modalities by name), where and
how its output goes, the bands and output kinds it asks for instead of the engine's, its
priority and its inputs' explicit dates. ``Engine.generate_image`` and ``Engine.add_request``,
``AsyncEngine.submit``, the HTTP routes, the map's tiles, the command line and Ray each build
one; ``Engine.prepare_request`` opens it (:mod:`geoserve.engine.admission`).

- :meth:`RequestSpec.normalised`: the canonical form admission works on (inputs a list, or a
  dict of modality name to a list; dates matched to them; bands and kinds as tuples);
- :meth:`RequestSpec.check`: what can be refused knowing only the spec and the engine's model,
  before anything is opened or fetched: the out format, the dates against the inputs, the
  bands, the output kinds and, for a front that fetches its inputs first, how many there are;
- :meth:`RequestSpec.to_json` / :meth:`RequestSpec.from_json`: the spec as a dict of plain JSON
  values, for a request that is stored. Paths, URLs and base64 text stay strings; bytes and
  uploads are base64 (an upload with the name it is reported by), a STAC Item is its JSON and
  where it was read from, a window of a file its path, name and offsets. An in-memory array
  (:class:`~geoserve.raster.input_values.RasterArray`) or a tensor cannot be stored.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, get_args

from geoserve.config import check_request_options
from geoserve.engine.stored_values import (
    choice_of,
    dates_json,
    field_of,
    items_of,
    restored_list,
    stored,
)
from geoserve.errors import ConfigError, InputError, count
from geoserve.raster.cube import expand
from geoserve.raster.dates import request_dates
from geoserve.raster.source import DataFormat, RasterLike
from geoserve.schemas import OUT_FORMATS, OutFormat
from geoserve.seeds import SEED_RANGE, is_seed
from geoserve.stac_query import StacSearch

if TYPE_CHECKING:
    from geoserve.engine.batch import PatchKeys
    from geoserve.processors.base import InputProcessor, OutputProcessor
    from geoserve.registry import ModelSpec

#: One request's input: a raster, the dates of one place, or modalities by name (a dict whose
#: values are a raster or a list of dates).
ImageInput = (
    RasterLike | StacSearch | Sequence[RasterLike] | Mapping[str, RasterLike | Sequence[RasterLike]]
)

#: Most inputs (files, URLs) one request of modalities may name, all dates together, where
#: they are counted before they are fetched (``RequestSpec.check(..., upfront=True)``).
MAX_MODALITY_INPUTS = 64

_DATA_FORMATS: tuple[str, ...] = get_args(DataFormat)


class ImageOptions(TypedDict, total=False):
    """The keywords of :meth:`Engine.generate_image` beside ``progress`` (see there)."""

    output_path: str | Path | None
    out_format: OutFormat
    data_format: DataFormat
    dates: Any
    bands: Sequence[int | str] | None
    output_kind: str | Sequence[str] | None
    priority: int
    seed: int
    temperature: float | None
    top_p: float | None
    top_k: int | None


class ModelView(Protocol):
    """What :meth:`RequestSpec.check` asks of an engine: its model and processors."""

    @property
    def spec(self) -> ModelSpec:
        """The model's registration (its name, in messages)."""

    @property
    def in_proc(self) -> InputProcessor:
        """The engine's input processor (its dates per request; bands replaced per request)."""

    def output_processors(self, kinds: str | Sequence[str]) -> tuple[OutputProcessor, ...]:
        """The output processor of each of ``kinds``, refusing a kind the model lacks."""


@dataclass(frozen=True)
class RequestSpec:
    """One request, as every front gives it to the engine (see the module docstring).

    Attributes:
        inputs: One raster (a path, URL, bytes, base64 text, :class:`NamedBytes`, a STAC Item,
            a :class:`RasterWindow` or a :class:`RasterArray`), a list of rasters (the dates of
            one place), or a dict of modality name to one raster or a list of its dates. An
            ``xarray.DataArray`` (band, [time,] y, x) is one raster per date of its ``time``
            dim (:mod:`geoserve.raster.cube`). A :class:`~geoserve.stac_query.StacSearch` is
            run when the request is opened: the cube of the scenes it finds.
        request_id: The request's id (None: the engine makes one).
        output_path: Where a ``path`` output goes (a file, the stem of several kinds' files, or
            a directory); None: the engine's output directory.
        out_format: ``path``, ``bytes``, ``b64``, ``tensor`` or ``xarray`` (docs/xarray.md).
        data_format: How to read text inputs (``auto``, ``path``, ``bytes``, ``b64``, ``url``).
        bands: Band selectors (0-based indices or descriptions) instead of the model's.
        output_kind: One kind, several (a sequence, or text separated by commas) from the same
            model pass, or None for the engine's.
        priority: Lower runs first; equal priorities in arrival order.
        seed: The seed of every random draw of a generative model for this request (each
            patch's draws derive from it and the patch's place on the scene: see
            :mod:`geoserve.models.steps`); 0 to 2**63 - 1. One-pass models ignore it.
        temperature, top_p, top_k: A generative model's token sampling for this request
            (None: the engine's; see :data:`geoserve.config.REQUEST_GENERATION_OPTIONS`);
            refused by a one-pass model.
        dates: The inputs' acquisition dates (ISO strings, ``date`` or ``datetime`` objects),
            one per input (``None`` for one: from its tags or file name); for a dict of
            modalities, a dict of modality name to its dates.
        patch_keys: How the request's patches are named in a patch cache (map tiles): patches
            found there do not run. Runtime only: not compared, and never stored by
            :meth:`to_json` (a restored spec has none).
    """

    inputs: ImageInput
    request_id: str | None = None
    output_path: str | os.PathLike[str] | None = None
    out_format: OutFormat = "path"
    data_format: DataFormat = "auto"
    bands: Sequence[int | str] | None = None
    output_kind: str | Sequence[str] | None = None
    priority: int = 0
    seed: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    dates: Any = None
    patch_keys: PatchKeys | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, request: ImageInput | RequestSpec, **fields: Any) -> RequestSpec:
        """``request`` as a spec: a spec with ``fields`` changed, or inputs with ``fields``."""
        if isinstance(request, RequestSpec):
            return dataclasses.replace(request, **fields) if fields else request
        return cls(request, **fields)

    @property
    def generation(self) -> dict[str, Any]:
        """The generation options this request sets (name -> value; none: the engine's)."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return {k: v for k, v in given.items() if v is not None}

    @property
    def kinds(self) -> tuple[str, ...] | None:
        """The output kinds asked for, as a tuple (None: the engine's)."""
        kinds = self.output_kind
        if not kinds:
            return None
        if isinstance(kinds, str):
            return tuple(k.strip() for k in kinds.split(","))
        return tuple(kinds)

    def normalised(self) -> RequestSpec:
        """The canonical form: inputs a list (or a dict of lists), dates matched, tuples.

        Normalising a normalised spec gives an equal one.

        Raises:
            InputError: the dates do not match the inputs, or a dict of modalities is empty,
                names a modality by anything but a non-empty string, or gives one no input.
        """
        items: list[Any] | dict[str, list[Any]]
        when: Any
        if isinstance(self.inputs, Mapping):
            items, when = modality_items(self.inputs, self.dates)
        else:
            given = self.inputs
            items = list(given) if isinstance(given, list | tuple) else expand(given)  # (cube)
            when = request_dates(self.dates, len(items))
        path = self.output_path
        return dataclasses.replace(
            self,
            inputs=items,
            dates=when,
            output_path=None if path is None else Path(path),
            bands=None if self.bands is None else tuple(self.bands),
            output_kind=self.kinds,
        )

    def check(self, engine: ModelView, *, upfront: bool = False) -> RequestSpec:
        """The spec normalised, refused where ``engine``'s model could not run it.

        Nothing is opened or fetched. ``upfront``: also count the inputs, as a front that
        fetches them before the engine opens them does (the HTTP API; its words: the ``data``
        field, or the ``file`` parts of an upload): a list may hold no more than the model's
        dates, a dict of modalities at most :data:`MAX_MODALITY_INPUTS` inputs.

        Raises:
            ConfigError: an invalid out format or seed, bands the model cannot read as given,
                or an output kind it does not offer (naming the ones it does).
            InputError: too many inputs (``upfront``), or dates that do not match them.
        """
        if self.out_format not in OUT_FORMATS:
            raise ConfigError(
                f"invalid out_format {self.out_format!r}; choose one of {', '.join(OUT_FORMATS)}"
            )
        if not is_seed(self.seed):
            raise ConfigError(f"seed: {SEED_RANGE}, got {self.seed!r:.40}")
        checked = check_request_options(self.generation)
        if upfront:
            self._check_count(engine)
        spec = dataclasses.replace(self.normalised(), **checked)
        if spec.bands is not None:
            engine.in_proc.replace(bands=spec.bands)
        if spec.output_kind is not None:
            engine.output_processors(spec.output_kind)
        return spec

    def _check_count(self, engine: ModelView) -> None:
        if isinstance(self.inputs, Mapping):
            n = sum(len(v) if isinstance(v, list | tuple) else 1 for v in self.inputs.values())
            if n > MAX_MODALITY_INPUTS:
                raise InputError(f"data: {n} inputs given; at most {MAX_MODALITY_INPUTS}")
            return
        n = len(self.inputs) if isinstance(self.inputs, list | tuple) else 1
        frames = max(1, engine.in_proc.num_frames)
        if n > frames:
            what = "file: {} parts" if self.data_format == "bytes" else "data: {} dates"
            raise InputError(
                f"{what.format(n)} given; model {engine.spec.name!r} takes {count(frames, 'date')}"
            )

    def to_json(self) -> dict[str, Any]:
        """The normalised spec as plain JSON values (``patch_keys`` left out).

        Raises:
            InputError: an input that cannot be stored (naming it: ``inputs[0]``,
                ``inputs['s2'][1]``), or dates that do not match the inputs.
        """
        spec = self.normalised()
        given: Any = spec.inputs  # (a list, or a dict of lists)
        inputs: Any
        if isinstance(given, Mapping):
            inputs = {
                k: [stored(x, f"inputs[{k!r}][{i}]") for i, x in enumerate(v)]
                for k, v in given.items()
            }
        else:
            inputs = [stored(x, f"inputs[{i}]") for i, x in enumerate(given)]
        path = spec.output_path
        return {
            "inputs": inputs,
            "request_id": spec.request_id,
            "output_path": None if path is None else os.fspath(path),
            "out_format": spec.out_format,
            "data_format": spec.data_format,
            "bands": None if spec.bands is None else list(spec.bands),
            "output_kind": None if spec.output_kind is None else list(spec.output_kind),
            "priority": spec.priority,
            "seed": spec.seed,
            **spec.generation,
            "dates": dates_json(spec.dates),
        }

    @classmethod
    def from_json(cls, data: Any) -> RequestSpec:
        """The spec :meth:`to_json` gave, normalised; ``data`` is checked as untrusted.

        Raises:
            InputError: naming the field at fault.
        """
        if not isinstance(data, Mapping):
            raise InputError("request spec: a JSON object is needed")
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            raise InputError(f"request spec: unknown field {unknown[0][:60]!r}")
        if "inputs" not in data:
            raise InputError("request spec: no 'inputs'")
        raw = data["inputs"]
        inputs: list[Any] | dict[str, list[Any]]
        if isinstance(raw, Mapping):
            inputs = {str(k): restored_list(v, f"inputs[{k!r}]") for k, v in raw.items()}
        else:
            inputs = restored_list(raw, "inputs")
        path = field_of(data, "output_path", str)
        seed = field_of(data, "seed", int) or 0
        if not is_seed(seed):
            raise InputError("request spec: 'seed' must be from 0 to 2**63 - 1")
        return cls(
            inputs,
            request_id=field_of(data, "request_id", str),
            output_path=None if path is None else Path(path),
            out_format=choice_of(data, "out_format", OUT_FORMATS, "path"),
            data_format=choice_of(data, "data_format", _DATA_FORMATS, "auto"),
            bands=items_of(data, "bands", (int, str)),
            output_kind=items_of(data, "output_kind", (str,)),
            priority=field_of(data, "priority", int) or 0,
            seed=seed,
            dates=data.get("dates"),
            **_generation(data),
        ).normalised()


def _generation(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored spec's generation options, checked."""
    given = {k: data[k] for k in ("temperature", "top_p", "top_k") if data.get(k) is not None}
    try:
        return check_request_options(given)
    except ConfigError as exc:
        raise InputError(f"request spec: {exc}") from None


#: The fields :meth:`RequestSpec.to_json` writes.
_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestSpec)) - {"patch_keys"}


def modality_items(
    inputs: Mapping[Any, Any], dates: Any
) -> tuple[dict[str, list[Any]], dict[str, Any] | None]:
    """A dict request's modalities, each as its list of dates, and their explicit dates.

    ``dates`` is None or a mapping of modality name to its dates (as for a list request).

    Raises:
        InputError: naming the modality or field at fault.
    """
    if not inputs:
        raise InputError("an empty dict of modalities; give at least one modality")
    items: dict[str, list[Any]] = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"modality names must be non-empty strings, got {name!r}")
        items[name] = list(value) if isinstance(value, list | tuple) else expand(value)
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
