"""The one table from geoserve errors to HTTP status codes, and the error response body."""

from __future__ import annotations

from typing import Any

from geoserve.errors import (
    ForbiddenInputError,
    GeoServeError,
    InputError,
    JobStoreError,
    ModelExecutionError,
    NotFoundError,
    OutputSpaceError,
    OutputTooComplexError,
    PayloadTooLargeError,
    QueueFullError,
    RasterReadError,
    RequestTimeoutError,
    ShuttingDownError,
    UnknownNameError,
    UnsupportedMediaTypeError,
    ZoomTooLowError,
)

# first match wins: subclasses before their parents
STATUS_TABLE: tuple[tuple[type[Exception], int], ...] = (
    (QueueFullError, 503),
    (ShuttingDownError, 503),
    (JobStoreError, 503),  # the job store's database failed: it may be back soon
    (PayloadTooLargeError, 413),
    (ForbiddenInputError, 403),
    (RequestTimeoutError, 504),
    (UnknownNameError, 404),
    (NotFoundError, 404),
    (ZoomTooLowError, 422),
    (OutputTooComplexError, 422),  # a class map too fragmented for vector output
    (UnsupportedMediaTypeError, 415),
    (ModelExecutionError, 500),
    (OutputSpaceError, 507),  # the output's disk is full: another replica may have room
    (RasterReadError, 400),
    (InputError, 400),
    (ValueError, 400),  # ConfigError, BandMismatchError, ...: the request's values are bad
)


def status_for(exc: GeoServeError) -> int:
    """HTTP status for a geoserve error (500 when nothing more specific applies)."""
    for cls, status in STATUS_TABLE:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(message: str, status: int, kind: str) -> dict[str, Any]:
    """The JSON error shape (as vLLM/OpenAI servers answer)."""
    return {"object": "error", "message": message, "type": kind, "code": status}


def ogc_exception(exc: BaseException) -> dict[str, Any]:
    """OGC API's exception body (``type``, ``title``, ``status``, ``detail``) for an error."""
    status = status_for(exc) if isinstance(exc, GeoServeError) else 500
    name = type(exc).__name__ if isinstance(exc, GeoServeError) else "InternalError"
    detail = str(exc) if isinstance(exc, GeoServeError) else "internal error"
    return {"type": f"urn:geoserve:error:{name}", "title": name, "status": status, "detail": detail}
