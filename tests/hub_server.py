"""A tiny Hugging Face Hub on 127.0.0.1 (http.server in a thread), honest unless told otherwise.

It answers what huggingface_hub asks while fetching a file: ``HEAD`` and ``GET``
``/{org}/{repo}/resolve/{revision}/{file}`` (with ``X-Repo-Commit``, ``ETag`` and
``Content-Length``, as the Hub does for a file stored in Git; a missing file is a 404 with
``X-Error-Code: EntryNotFound``), and ``GET /api/models/{org}/{repo}/tree/{revision}`` (the
listing). ``etags`` and ``commit`` override what it answers, to play a hostile endpoint.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from tests.hub_cache import COMMIT, ORG, REPO


class FakeHub:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.commit = COMMIT  # the X-Repo-Commit of every answer
        self.etags: dict[str, str] = {}  # a file's ETag instead of its Git blob id
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.drop = 0  # the first this many HEADs: the connection closed, no answer
        self.url = ""

    def etag(self, name: str) -> str:
        data = self.files[name]
        return self.etags.get(name) or hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Authorization")))
            if hub.drop > 0 and self.command == "HEAD":  # a connection error: a retry
                hub.drop -= 1
                self.close_connection = True
                return
            repo = f"/{ORG}/{REPO}/resolve/"
            tree = f"/api/models/{ORG}/{REPO}/tree/"
            if path.startswith(repo):
                name = path[len(repo) :].split("/", 1)[1]
                if name in hub.files:
                    data = hub.files[name]
                    self._send(200, data if body else b"", len(data), ETag=f'"{hub.etag(name)}"')
                else:
                    self._send(404, b"", 0, **{"X-Error-Code": "EntryNotFound"})
            elif path.startswith(tree) and body:
                listing = [
                    {"type": "file", "path": name, "size": len(data), "oid": hub.etag(name)}
                    for name, data in hub.files.items()
                ]
                data = json.dumps(listing).encode()
                self._send(200, data, len(data), **{"Content-Type": "application/json"})
            else:
                self._send(404, b"", 0, **{"X-Error-Code": "RepoNotFound"})

        def _send(self, status: int, data: bytes, length: int, **headers: str) -> None:
            self.send_response(status)
            self.send_header("X-Repo-Commit", hub.commit)
            self.send_header("Content-Length", str(length))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if data:
                self.wfile.write(data)

    return Handler


@contextmanager
def fake_hub(files: dict[str, bytes]) -> Iterator[FakeHub]:
    """Serve ``files`` as ``ORG/REPO`` at ``COMMIT``; yields the hub, its ``url`` set."""
    hub = FakeHub(files)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
