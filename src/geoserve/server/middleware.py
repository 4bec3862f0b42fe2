"""One ASGI middleware for the guards that come before any route runs.

In order: health routes pass untouched; a ``Host`` the server does not answer to gets 400 and
a cross-site request that changes state 403 (:mod:`geoserve.server.origins`); the API key is
checked (constant-time) → 401; while draining, new requests get 503; the body is limited by
its declared length and again by the bytes actually received (a missing or false
``Content-Length`` does not help) → 413. Every answer carries ``nosniff``,
``X-Frame-Options: DENY``, ``Referrer-Policy: same-origin`` and a Content-Security-Policy (the
page's allows only its own files, and the basemap's host). It also counts requests in flight
(the drain waits for them), records status codes for metrics, and turns any unexpected
exception into a JSON 500 without a traceback. A ``serve_multiplexed_model_id`` header (Ray
Serve's) names the request's model where its body does not (:data:`~geoserve.server.served.
HEADER_MODEL`). :func:`unless_disconnected` is its counterpart
inside a route: the route's work is cancelled when its client goes away.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import re
import uuid
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from geoserve.job_wire import MODEL_HEADER
from geoserve.server.errors import error_body
from geoserve.server.metrics import Metrics
from geoserve.server.origins import HostRule, refusal
from geoserve.server.served import HEADER_MODEL
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")
ROUTES = {"/v1/images", "/pooling", "/v1/models", "/metrics", "/v1/scenes", "/"}


def _page(scope: Scope) -> bool:
    """The map page and its files: what a browser opens by itself."""
    path: str = scope["path"]
    return path == "/" or path.startswith("/ui/")


def _basic(headers: dict[str, str]) -> bool:
    """The request carries HTTP Basic credentials (what a browser remembers and resends)."""
    return headers.get("authorization", "").lower().startswith("basic ")


def page_policy(basemap_url: str | None) -> str:
    """The map page's Content-Security-Policy: its own files, and the basemap's tiles."""
    images = "'self' data: blob:"
    if basemap_url:
        parts = basemap_url.split("/", 3)  # scheme:, '', host (maybe with {s}), path
        host = re.sub(r"\{[^}]*\}", "*", parts[2]) if len(parts) > 2 else ""
        ok = re.fullmatch(r"(\*\.)?[A-Za-z0-9.-]+(:[0-9]+)?", host)
        images += f" {parts[0]}//{host}" if ok else f" {parts[0]}"
    return (
        "default-src 'self'; script-src 'self'; style-src 'self'; "
        f"img-src {images}; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )


def _security_headers(policy: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
        (b"content-security-policy", policy.encode()),
    ]


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
    """Wraps one request's receive/send: counts body bytes, notes when the response starts.

    With an engine (``ledger``: its :class:`~geoserve.engine.ledger.MemoryLedger`), what the
    server holds for the request outside the engine is counted against its memory bound: the
    body as it arrives (``factor`` times: a JSON body is
    held as bytes and again as parsed text) until the request is admitted (its own estimate,
    which counts its upload, then takes over: ``scope["geoserve.held"]`` names the key), and
    each part of the answer while the client takes it. A body that does not fit fails the
    request (503 or 413) while it streams in.
    """

    def __init__(self, receive: Receive, send: Send, limit: int, ledger: Any, factor: int) -> None:
        self._receive, self._send, self._limit = receive, send, limit
        self._ledger, self._factor = ledger, factor
        self.key = f"held-{uuid.uuid4().hex}"
        self.received = 0
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            chunk = len(message.get("body", b""))
            self.received += chunk
            if self.received > self._limit:
                raise BodyTooLarge()
            if chunk and self._ledger is not None:
                self._ledger.hold(self.key, self.received * self._factor, "the request body")
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        body = message.get("body", b"") if message["type"] == "http.response.body" else b""
        if self._ledger is None or len(body) < 65536:
            await self._send(message)
            return
        # the answer's bytes are held until the client has taken them (the server's send
        # waits while its buffer is full): a streamed answer holds one chunk at a time
        self._ledger.hold(self.key, len(body), "the answer", force=True)
        try:
            await self._send(message)
        finally:
            self._ledger.release(self.key)

    def release(self) -> None:
        if self._ledger is not None:
            self._ledger.release(self.key)


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
        self.hosts = HostRule.for_server(settings.host, settings.allowed_hosts)
        self.api_headers = _security_headers("default-src 'none'; frame-ancestors 'none'")
        self.page_headers = _security_headers(page_policy(settings.basemap_url))
        state.setdefault("in_flight", 0)

    def _authorized(self, headers: dict[str, str]) -> bool:
        key = self.settings.api_key
        if not key:
            return True
        given = headers.get("x-api-key", "")
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        elif _basic(headers):  # a browser on the map page: the password
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
        extra = self.page_headers if _page(scope) else self.api_headers

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen["code"] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self._guarded(scope, receive, send_counted)
        finally:
            code = str(status_seen["code"])
            self.metrics.requests.labels(endpoint=endpoint, status=code).inc()

    def _refused(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """(status, message, kind) if the Host or the same-origin rule refuses it; else None."""
        if not self.hosts.allows(headers.get("host")):
            host = headers.get("host", "")[:100]
            name = host.rsplit(":", 1)[0] or "NAME"
            message = (
                f"Host {host!r} is not a name this server answers to; start it with "
                f"--allowed-host {name} to allow it"
            )
            return 400, message, "HostNotAllowedError"
        why = refusal(scope["method"], headers, scope.get("scheme", "http"), basic=_basic(headers))
        return None if why is None else (403, why, "CrossSiteRequestError")

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refused = self._refused(scope, headers)
        if refused is not None:
            status, message, kind = refused
            await _send_json(send, status, error_body(message, status, kind))
            return
        if not self._authorized(headers):
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
        declared = headers.get("content-length")
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
        json_body = "json" in headers.get("content-type", "")
        ledger = self.state.get("ledger")
        ex = _Exchange(receive, send, self.limit, ledger, 2 if json_body else 1)
        scope["geoserve.held"] = ex.key
        self.state["in_flight"] += 1
        named = HEADER_MODEL.set(headers.get(MODEL_HEADER) or None)
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
            HEADER_MODEL.reset(named)
            ex.release()
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
