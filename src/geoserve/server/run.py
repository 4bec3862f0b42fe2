"""Running the app under uvicorn, with a SIGTERM drain.

On the first SIGTERM (or Ctrl+C) the server keeps listening but answers new requests with 503
and reports not-ready, lets in-flight requests finish for up to ``shutdown_timeout_s``, then
exits. A second Ctrl+C exits at once. With ``--ui`` the map page's address is logged once the
socket is bound (and a warning when uploads are off: no ``--output-dir``).
"""

from __future__ import annotations

import logging
import signal
import socket
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

    def __init__(
        self, config: uvicorn.Config, app: FastAPI, timeout: float, *, page: bool = False
    ) -> None:
        super().__init__(config)
        self._app = app
        self._timeout = timeout
        self._draining = False
        self._page = page

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start listening; then log the map page's address (with ``--ui``)."""
        await super().startup(sockets)
        if self._page and not self.should_exit and self.servers:
            bound = self.servers[0].sockets[0].getsockname()
            logger.info("map page: %s", page_url(self.config.host, bound[1]))

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


def page_url(host: str, port: int) -> str:
    """The map page's address for a server bound to ``host``:``port``."""
    if host in ("0.0.0.0", "::", ""):  # every interface: this machine's own name reaches it
        return f"http://{socket.gethostname()}:{port}/ (on this machine http://127.0.0.1:{port}/)"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(settings: ServerSettings) -> int:
    """Serve until a shutdown signal; returns the exit code."""
    if settings.ui and settings.output_dir is None:
        logger.warning(
            "--ui without --output-dir: the map page cannot upload scenes (uploads are off); "
            "start the server with --output-dir DIR to upload them"
        )
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
    server = DrainingServer(config, app, settings.shutdown_timeout_s, page=settings.ui)
    server.run()
    return 0
