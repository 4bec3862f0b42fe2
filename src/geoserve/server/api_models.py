"""The bodies the HTTP API accepts, and parsing them without trusting them.

``POST /v1/images`` takes :class:`ImagesRequest` (or a multipart upload), ``POST /pooling``
vLLM's :class:`PoolingRequest`. Parsing never lets a client's body hurt the server: a large
JSON body is parsed off the event loop, deeply nested JSON is a 400 (not a ``RecursionError``),
and empty data is refused with a message naming the field.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from geoserve.errors import InputError, UnsupportedMediaTypeError
from geoserve.schemas import OutputKind
from geoserve.seeds import MAX_SEED
from geoserve.stac_query import StacSearch

InFormat = Literal["b64_json", "path", "url"]
OutDataFormat = Literal["b64_json", "path", "geotiff"]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
#: A modality's name: ASCII letters, digits and "_", not starting with a digit.
MODALITY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
ModalityName = Annotated[str, StringConstraints(pattern=MODALITY_PATTERN)]
#: Most modalities one request may name (TerraMind takes eight).
MAX_MODALITIES = 16
#: Inputs of one modality: one, or a list of dates.
OneOrDates = NonEmpty | Annotated[list[NonEmpty], Field(min_length=1)]
#: Modalities by name: ``{"s2": ..., "s1": [...]}``.
ModalityData = Annotated[
    dict[ModalityName, OneOrDates], Field(min_length=1, max_length=MAX_MODALITIES)
]

#: JSON bodies larger than this are parsed in a worker thread, not on the event loop.
OFF_LOOP_JSON_BYTES = 256 * 1024


class ImageOptions(BaseModel):
    """Per-request overrides."""

    model_config = ConfigDict(extra="forbid")
    bands: list[int | str] | None = None
    output_kind: OutputKind | None = None
    output_kinds: Annotated[list[OutputKind], Field(min_length=1, max_length=8)] | None = None
    """Several kinds from one model pass; the response has one entry per kind."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED, strict=True)] | None = None
    """The seed of a generative model's random draws (0 to 2**63 - 1; none: 0): the same
    seed and inputs give the same output. A JSON integer only (not text, a float or a
    boolean); one-pass models ignore it."""
    temperature: Annotated[float, Field(strict=True)] | None = None
    """A generative model's token sampling temperature for this request (0: the most likely
    token; none: the server's); bounds as the server's ``temperature`` option."""
    top_p: Annotated[float, Field(strict=True)] | None = None
    """A generative model's nucleus sampling threshold for this request (none: the server's)."""
    top_k: Annotated[int, Field(strict=True)] | None = None
    """A generative model's top-k for this request (0: all tokens; none: the server's)."""

    @model_validator(mode="after")
    def _one_way(self) -> ImageOptions:
        if self.output_kind is not None and self.output_kinds is not None:
            raise ValueError("give output_kind or output_kinds, not both")
        if self.output_kinds is not None and len(set(self.output_kinds)) != len(self.output_kinds):
            raise ValueError("output_kinds: a kind asked for more than once")
        return self

    @property
    def kinds(self) -> list[str] | None:
        """The kinds asked for (None: the server's)."""
        if self.output_kinds is not None:
            return list(self.output_kinds)
        return [self.output_kind] if self.output_kind is not None else None


class ImagesRequest(BaseModel):
    """JSON body of ``POST /v1/images``."""

    model_config = ConfigDict(extra="forbid")
    model: NonEmpty | None = None
    """The served model to run (optional when the server serves one)."""
    data: OneOrDates | ModalityData | None = None
    """One input, the dates of one place (a list), or modalities by name (a dict)."""
    stac: dict[str, Any] | None = None
    """Instead of ``data``: a STAC API search (``url``, ``collections``, ``bbox``, and
    optionally ``datetime``, ``max_cloud``, ``resolution``, ``crs``, ``max_items``; see
    :class:`~geoserve.stac_query.StacSearch`), its catalogue at an allowed URL domain."""
    data_format: InFormat = "b64_json"
    out_data_format: OutDataFormat = "b64_json"
    options: ImageOptions = Field(default_factory=ImageOptions)
    priority: int = 0
    dates: Any = None
    """ISO 8601 acquisition dates, one per ``data`` item (for models that take dates; for
    modalities, a dict of modality name to its dates); checked before any input is fetched,
    so a bad one is a 400 naming the field."""

    @model_validator(mode="after")
    def _one_input(self) -> ImagesRequest:
        if (self.data is None) == (self.stac is None):
            raise ValueError("give data (the inputs) or stac (a STAC API search), one of them")
        return self

    def inputs(self) -> Any:
        """The request's inputs: ``data``, or the search ``stac`` describes.

        Raises:
            InputError: a ``stac`` object that is not a search (naming the field).
        """
        if self.stac is not None:
            return StacSearch.from_json(self.stac)
        return self.data

    @property
    def input_format(self) -> str:
        """``data_format``, or ``auto`` for a search (whose files are read as URLs)."""
        return "auto" if self.stac is not None else self.data_format


class PoolingData(BaseModel):
    """The ``data`` object of vLLM's IO-processor requests.

    ``data`` is one input (the Prithvi plugin), or modalities by name, each one input (the
    TerraMind plugin: ``{"S2L1C": url, "S1GRD": url}``).
    """

    model_config = ConfigDict(extra="ignore")
    data: (
        NonEmpty
        | Annotated[dict[ModalityName, NonEmpty], Field(min_length=1, max_length=MAX_MODALITIES)]
    )
    data_format: InFormat = "b64_json"
    out_data_format: Literal["b64_json", "path"] = "b64_json"
    indices: list[int] | None = None


class PoolingRequest(BaseModel):
    """vLLM's ``POST /pooling`` request with an IO-processor plugin (extra fields ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    data: PoolingData
    priority: int = 0


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"request body is not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError("request body is not acceptable JSON (nested too deeply)") from None


async def parse_json(model: type[BaseModel], raw: bytes, content_type: str) -> Any:
    """Validate ``raw`` as ``model``; large bodies are decoded in a worker thread.

    The body must be declared JSON (``application/json`` or ``+json``): a ``text/plain`` or
    form body is what another site's page can make a browser send without asking, so it is
    never read as a request.

    Raises:
        UnsupportedMediaTypeError: not declared JSON (415); InputError: not JSON;
        RequestValidationError: JSON of the wrong shape (422).
    """
    media = content_type.partition(";")[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise UnsupportedMediaTypeError(
            f"Content-Type {media or 'missing'!r}: send JSON with 'Content-Type: "
            "application/json' (or a multipart/form-data upload where the route takes one)"
        )
    if not raw.strip():
        raise InputError("request body is empty; send JSON or a multipart upload")
    big = len(raw) > OFF_LOOP_JSON_BYTES
    payload = await asyncio.to_thread(_loads, raw) if big else _loads(raw)
    return validate(model, payload)


def validate(model: type[BaseModel], payload: Any) -> Any:
    """``model.model_validate(payload)``, its errors as FastAPI's 422."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    except RecursionError:
        raise InputError("request body is not acceptable JSON (nested too deeply)") from None


def form_json(value: Any) -> Any:
    """The multipart ``options`` field as JSON (empty: no options)."""
    if value is None or value == "":
        return {}
    try:
        return json.loads(str(value))
    except json.JSONDecodeError as exc:
        raise InputError(f"form field 'options' is not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError("form field 'options' is nested too deeply") from None


def form_dates(values: list[Any]) -> list[str] | None:
    """The multipart ``dates`` fields: comma-separated, or one field per date (none: None)."""
    dates: list[str] = []
    for value in values:
        if not isinstance(value, str):
            raise InputError("form field 'dates' must be text (ISO dates, comma-separated)")
        dates.extend(d.strip() for d in value.split(","))
    if not any(dates):
        return None
    for d in dates:
        if not d:
            raise InputError(f"form field 'dates' has an empty date: {','.join(dates)!r}")
    return dates


def validation_message(errors: Any) -> str:
    """One line naming every invalid field."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)
