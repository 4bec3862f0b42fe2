"""Every exception and warning geoserve raises.

All errors derive from :class:`GeoServeError`, so a caller can catch the whole family with one
``except``. Each subclass also inherits the matching built-in (``OSError`` for unreadable files,
``ValueError`` for bad values, ``KeyError`` for unknown names), so code written against the
built-ins keeps working. Messages name the file, band, model or field at fault: they are shown to
users verbatim by the CLI and (later) by the HTTP server.

This module imports nothing from geoserve.
"""

from __future__ import annotations

from collections.abc import Iterable


class GeoServeError(Exception):
    """Root of every error geoserve raises on purpose."""


class ConfigError(GeoServeError, ValueError):
    """Raised when a processor, engine or CLI option has an invalid value."""


class RegistryError(GeoServeError, ValueError):
    """Raised when a name is registered twice, or a registration is malformed."""


class UnknownNameError(GeoServeError, KeyError):
    """Raised when a registry lookup names something that is not registered."""

    def __init__(self, label: str, name: str, known: Iterable[str]) -> None:
        import difflib

        known = sorted(known)
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        listing = ", ".join(known) if known else "(none registered)"
        self.label, self.name, self.known = label, name, known
        super().__init__(f"unknown {label} {name!r}{hint}; known: {listing}")

    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return str(self.args[0])

    def __reduce__(self) -> tuple[object, ...]:
        # picklable (worker processes, Ray) despite the richer constructor
        return (_rebuild_unknown, (type(self), self.args, self.label, self.name, self.known))


def _rebuild_unknown(
    cls: type[UnknownNameError], args: tuple[object, ...], label: str, name: str, known: list[str]
) -> UnknownNameError:
    err = cls.__new__(cls)
    err.args = args
    err.label, err.name, err.known = label, name, known
    return err


class UnknownModelError(UnknownNameError):
    """Raised when a model name is not in the model registry."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__("model", name, known)


class ProcessorMismatchError(GeoServeError, ValueError):
    """Raised when a model lacks an input or output processor, or they disagree with the model."""


class PluginLoadError(GeoServeError, ImportError):
    """Raised when a plugin that was asked for is missing or fails to load."""


class InputError(GeoServeError, ValueError):
    """Raised when a request's input cannot be used (bad format, size, dtype, dates)."""


class RasterReadError(GeoServeError, OSError):
    """Raised when an input raster is missing, unreadable, truncated or corrupt."""


class InputFormatError(InputError):
    """Raised when an input's content is not one of the allowed formats (a VRT, say)."""


class BandMismatchError(GeoServeError, ValueError):
    """Raised when an input lacks bands the model needs (too few, or a name that is absent)."""


class WeightsError(GeoServeError, OSError):
    """Raised when model weights are needed but missing, or cannot be loaded."""


class ModelOutputShapeError(GeoServeError, ValueError):
    """Raised when a model returns a tensor of a shape the output processor cannot use."""


class ModelExecutionError(GeoServeError, RuntimeError):
    """Raised (per request) when the model's forward pass failed on a batch holding its patches."""


class ReadError(GeoServeError, RuntimeError):
    """Raised (per request) when reading a request's input failed in an unexpected way.

    A known bad input is a :class:`RasterReadError` or :class:`InputError`; this wraps anything
    else (a bug in an input processor, say), naming the input.
    """


class OutputWriteError(GeoServeError, OSError):
    """Raised when an output cannot be processed, written, finished or verified."""


class OutputSpaceError(OutputWriteError):
    """Raised when the output's file system is full (or the output would not fit on it)."""


class OutputTooComplexError(GeoServeError, ValueError):
    """Raised when a vector output would exceed its cost bound (a fragmented class map).

    The message names the kind, the count reached, the bound and the option that sets it.
    """


class PayloadTooLargeError(InputError):
    """Raised when a request's body or decoded pixels exceed the configured limit."""


class UnsupportedMediaTypeError(InputError):
    """Raised for a body whose Content-Type is not one the route reads (JSON routes: JSON)."""


class ZoomTooLowError(InputError):
    """Raised for a map tile below the zoom at which a scene's tiles are predicted on demand."""


class NotFoundError(GeoServeError, LookupError):
    """Raised for an id that names nothing here (an expired or unknown scene); it lists none."""


class ForbiddenInputError(GeoServeError, PermissionError):
    """Raised when a request names a path or URL outside what the server allows."""


class QueueFullError(GeoServeError, RuntimeError):
    """Raised when admitting a request would exceed the bound on queued patches."""


class ModelLoadError(GeoServeError, RuntimeError):
    """Raised for requests to a served model that failed to load (the server's fault: 500)."""


class ShuttingDownError(GeoServeError, RuntimeError):
    """Raised for new requests while the engine drains before shutdown."""


class JobStoreError(GeoServeError, RuntimeError):
    """Raised when the job store's database fails once it is open.

    The SQLite file removed, replaced or locked past the store's wait; a write refused (a
    read-only file or disk, a full disk); the PostgreSQL server gone or the connection dropped.
    The message names the store (its file, or its server without a password) and the
    database's reason; the server answers it as a 503.
    """


class RequestTimeoutError(GeoServeError, TimeoutError):
    """Raised when a request does not finish within its deadline (its patches are dropped)."""


class RequestAbortedError(GeoServeError, RuntimeError):
    """Raised inside a request's own work (its commit) once the request was aborted.

    It stops that work at its next check; the request's caller already has its answer (a
    timeout, or it went away), so nobody receives this error.
    """


class ServerError(GeoServeError, RuntimeError):
    """Raised by :class:`geoserve.Client` when a server answers with an error.

    The message names the method, the URL, the status and the server's own message;
    ``status`` holds the HTTP status (``None`` when no answer came).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerUnreachableError(ServerError, ConnectionError):
    """Raised when a server cannot be reached (refused, timed out, a broken connection)."""


class ServerAuthError(ServerError, PermissionError):
    """Raised when a server refuses the API key (missing or wrong: HTTP 401)."""


class UntrustedAnswerError(ServerError):
    """Raised when a server's answer is refused unread.

    A malformed job id, a link to another host, a file name with a path in it, a download
    larger than the server said, a redirect.
    """


class JobFailedError(GeoServeError, RuntimeError):
    """Raised when a job ended ``failed``; the message is the server's.

    ``error`` holds its OGC exception body (``type``, ``title``, ``status``, ``detail``).
    """

    def __init__(self, message: str, error: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.error = error


class JobDismissedError(JobFailedError):
    """Raised when a job was dismissed before it finished (or its results were withdrawn)."""


class GeoServeWarning(UserWarning):
    """Root of geoserve's warnings."""


class NotGeoreferencedWarning(GeoServeWarning):
    """Issued when an input has no CRS or transform; the output will have none either."""


def count(n: int, noun: str) -> str:
    """``count(1, "band")`` is "1 band", ``count(3, "band")`` "3 bands" (for messages)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def prefixed(exc: GeoServeError, prefix: str) -> GeoServeError:
    """``exc`` again, its message led by ``prefix`` (the modality or part it belongs to)."""
    try:
        return type(exc)(f"{prefix}: {exc}")
    except TypeError:  # an error class with its own constructor arguments
        return GeoServeError(f"{prefix}: {exc}")
