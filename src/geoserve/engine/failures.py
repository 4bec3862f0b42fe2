"""Failure isolation: whatever goes wrong on a request's path fails that request alone.

Every stage that works on one request (reading its rows, stitching its output patches, writing
its rows, committing its output) runs under :func:`isolate`. A :class:`GeoServeError` fails the
request as it is (it already names the input and what is wrong); any other exception is a bug
in a processor or an I/O surprise: it is logged with its traceback and becomes the typed error
of the stage (:class:`ReadError`, :class:`OutputWriteError`) naming the input. Either way the
engine keeps serving the other requests. Forward passes fail the requests of a batch the same
way (see :mod:`geoserve.engine.runner`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from geoserve.errors import GeoServeError, OutputWriteError, ReadError

if TYPE_CHECKING:
    from geoserve.engine.request import Request

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """A step of a request's path: what it does (for the log) and the error it fails with."""

    doing: str
    error: type[GeoServeError]
    failed: str


READ = Stage("reading", ReadError, "read failed")
STITCH = Stage("stitching a patch of", OutputWriteError, "output processing failed")
WRITE = Stage("writing the output of", OutputWriteError, "output processing failed")
FINISH = Stage("finishing", OutputWriteError, "output processing failed")

#: How a request is failed: ``Scheduler.fail`` (drops it and queues its failed output).
Fail = Callable[["Request", GeoServeError], None]


def request_error(req: Request, exc: Exception, stage: Stage) -> GeoServeError:
    """``exc`` as the error that fails ``req`` at ``stage`` (logged unless it is expected)."""
    if isinstance(exc, GeoServeError):
        return exc
    logger.exception("%s request %s failed", stage.doing, req.request_id)
    return stage.error(f"{req.ctx.names[0]}: {stage.failed}: {exc!r}")


@contextlib.contextmanager
def isolate(req: Request, stage: Stage, fail: Fail) -> Iterator[None]:
    """Run the block for ``req``; an exception in it fails ``req`` alone and is not raised.

    Code after the block runs either way: it checks ``req.error`` when it needs to know.
    """
    try:
        yield
    except Exception as exc:
        fail(req, request_error(req, exc, stage))
