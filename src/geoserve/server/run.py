"""Running the app under uvicorn, with a SIGTERM drain.

On the first SIGTERM (or Ctrl+C) the server keeps listening but answers new requests with 503
and reports not-ready, lets in-flight requests finish for up to ``shutdown_timeout_s``, then
exits. A second Ctrl+C exits at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from geoserve.server.app import create_app
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first shutdown signal drains instead of closing the socket."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, timeout: float) -> None:
        super().__init__(config)
        self._app = app
        self._timeout = timeout
        self._draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Start draining on the first signal; defer to uvicorn on the next."""
        if self._draining:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        state = self._app.state.geoserve
        state["draining"] = True
        logger.info("signal %s: draining (up to %.0f s)", signal.Signals(sig).name, self._timeout)
        threading.Thread(target=self._drain, args=(state,), daemon=True).start()

    def _drain(self, state: dict[str, object]) -> None:
        deadline = time.monotonic() + self._timeout
        while state.get("in_flight", 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = state.get("in_flight", 0)
        if left:
            logger.warning("shutdown timeout: %s request(s) still in flight are cancelled", left)
        self.should_exit = True


def serve(settings: ServerSettings) -> int:
    """Serve until a shutdown signal; returns the exit code."""
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        lifespan="on",
        # the drain above already gave in-flight requests their time: uvicorn then only
        # closes what is left (cancelled handlers answer 503), it must not wait that long again
        timeout_graceful_shutdown=1,
    )
    server = DrainingServer(config, app, settings.shutdown_timeout_s)
    server.run()
    return 0
