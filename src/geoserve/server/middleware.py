"""One ASGI middleware for the guards that come before any route runs.

In order: health routes pass untouched; the API key is checked (constant-time) → 401; while
draining, new requests get 503; the body is limited by its declared length and again by the
bytes actually received (a missing or false ``Content-Length`` does not help) → 413. It also
counts requests in flight (the drain waits for them), records status codes for metrics, and
turns any unexpected exception into a JSON 500 without a traceback. :func:`unless_disconnected`
is its counterpart inside a route: the route's work is cancelled when its client goes away.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from geoserve.server.errors import error_body
from geoserve.server.metrics import Metrics
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")
ROUTES = {"/v1/images", "/pooling", "/v1/models", "/metrics", "/v1/scenes", "/"}


def _page(scope: Scope) -> bool:
    """The map page and its files: what a browser opens by itself."""
    path: str = scope["path"]
    return path == "/" or path.startswith("/ui/")


class BodyTooLarge(Exception):
    """The request body grew past the limit while streaming in."""


class ClientDisconnected(Exception):
    """The client went away before its result was ready."""


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


class _Exchange:
    """Wraps one request's receive/send: counts body bytes, notes when the response starts."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive, self._send, self._limit = receive, send, limit
        self.received = 0
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self._limit:
                raise BodyTooLarge()
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class GuardMiddleware:
    """See the module docstring."""

    def __init__(
        self, app: ASGIApp, settings: ServerSettings, state: dict[str, Any], metrics: Metrics
    ) -> None:
        self.app = app
        self.settings = settings
        self.state = state
        self.metrics = metrics
        self.limit = int(settings.max_body_mb * 1024 * 1024)
        state.setdefault("in_flight", 0)

    def _authorized(self, scope: Scope) -> bool:
        key = self.settings.api_key
        if not key:
            return True
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-api-key", "")
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        elif auth.lower().startswith("basic "):  # a browser on the map page: the password
            # a browser sends Basic credentials by itself, also for another site's page that
            # posts here: those (Sec-Fetch-Site cross-site or same-site) are refused
            if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                return False
            try:
                given = base64.b64decode(auth[6:].strip()).decode().partition(":")[2]
            except (ValueError, UnicodeDecodeError):
                given = ""
        return hmac.compare_digest(given.encode(), key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Apply the guards, then call the app."""
        if scope["type"] != "http" or scope["path"].startswith("/health/"):
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in ROUTES else "other"
        status_seen = {"code": 500}

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen["code"] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, send_counted)
        finally:
            code = str(status_seen["code"])
            self.metrics.requests.labels(endpoint=endpoint, status=code).inc()

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._authorized(scope):
            await _send_json(
                send,
                401,
                error_body("missing or wrong API key", 401, "Unauthorized"),
                # a browser asks its user for the key (as the password) for the map page
                {"WWW-Authenticate": 'Basic realm="geoserve"' if _page(scope) else "Bearer"},
            )
            return
        retry = {"Retry-After": str(self.settings.retry_after_s)}
        if self.state.get("draining"):
            await _send_json(
                send, 503, error_body("server is shutting down", 503, "ShuttingDownError"), retry
            )
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _send_json(
                send,
                413,
                error_body(
                    f"request body of {int(declared)} bytes is over the limit of {self.limit}",
                    413,
                    "PayloadTooLargeError",
                ),
            )
            return
        ex = _Exchange(receive, send, self.limit)
        self.state["in_flight"] += 1
        try:
            await self.app(scope, ex.receive, ex.send)
        except BodyTooLarge:
            if not ex.started:
                await _send_json(
                    send,
                    413,
                    error_body(
                        f"request body is over the limit of {self.limit} bytes",
                        413,
                        "PayloadTooLargeError",
                    ),
                )
        except ClientDisconnected:
            logger.info("client disconnected; its request was cancelled")
        except asyncio.CancelledError:  # the server stopped waiting (drain timeout)
            if not ex.started:
                with contextlib.suppress(Exception):
                    await _send_json(
                        send,
                        503,
                        error_body(
                            "server shut down before the request finished; retry",
                            503,
                            "ShuttingDownError",
                        ),
                        retry,
                    )
            raise
        except Exception:
            logger.exception("unhandled error on %s", scope["path"])
            if not ex.started:
                await _send_json(
                    send, 500, error_body("internal server error", 500, "InternalServerError")
                )
        finally:
            self.state["in_flight"] -= 1


async def unless_disconnected(request: Request, job: Any) -> Any:
    """Await ``job``; if the client disconnects first, cancel it (dropping its patches)."""
    task = asyncio.ensure_future(job)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()  # type: ignore[no-any-return]
    task.cancel()
    raise ClientDisconnected()
