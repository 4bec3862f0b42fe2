"""What a tile's ``source`` names, by the trust rules of ``/v1/images``.

A path under an allowed input directory (named for the patch cache by the file's identity), an
``http(s)`` URL on an allowed host that answers range requests (vetted, then trusted for
:data:`URL_CHECK_S` when it has a validator), or ``output:NAME``, a GeoTIFF the server wrote
under ``--output-dir``. An uploaded scene's id is the scene store's (``server/scene_routes.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from pathlib import Path

from geoserve.engine.patch_cache import Unvalidated, file_identity
from geoserve.errors import ForbiddenInputError, InputError, NotFoundError, RasterReadError
from geoserve.server.gather import open_budget
from geoserve.server.inputs import remote_input, resolve_input_path
from geoserve.server.settings import ServerSettings
from geoserve.tiles.service import TileSource

_OUTPUT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,200}\.tif")
#: How long a vetted URL source with a validator (ETag, Last-Modified) is trusted before it
#: is checked (and its validator read) again; one without is checked for every tile.
URL_CHECK_S = 60.0
#: Vetted URLs remembered at most (all forgotten at once past it).
MAX_URLS = 256


class MapSources:
    """Resolves tile sources for one server (its settings; its cache of vetted URLs)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._urls: dict[str, tuple[float, TileSource]] = {}

    async def resolve(self, text: str) -> TileSource:
        """A path or URL tile source by the trust rules of ``/v1/images``.

        Raises:
            GeoServeError: the path or URL is not allowed, not found, or cannot be tiled.
        """
        if text.startswith(("http://", "https://")):
            return await self._url_source(text)
        s = self.settings
        path = await asyncio.to_thread(resolve_input_path, text, s.allowed_input_dirs)
        try:  # (what it is, a regular file, open_raster checks when the tile opens it)
            identity = file_identity(path)
        except OSError:
            raise RasterReadError(f"{text}: not found") from None
        return TileSource(Path(path).name, path, identity)

    async def _url_source(self, url: str) -> TileSource:
        known = self._urls.get(url)
        if known is not None and time.monotonic() - known[0] < URL_CHECK_S:
            return known[1]
        s = self.settings
        if s.url_reads != "range":
            raise ForbiddenInputError(
                f"{url}: tiles read URLs in place; this server downloads them"
            )
        head: dict[str, str] = {}
        where = await remote_input(  # (a host without range requests: refused, not fetched)
            url,
            s.allowed_url_domains,
            int(s.max_body_mb * 1024 * 1024),
            s.request_timeout_s,
            tuple(s.engine.allowed_formats),
            head,
            open_budget(s, time.monotonic() + s.request_timeout_s),
            download=False,
        )
        if not isinstance(where, str):  # (never: download=False)
            raise InputError(f"{url}: tiles need a server that answers HTTP range requests")
        # GDAL keeps what it read of a URL for later opens of the same name: the name it is
        # given carries a fragment (never sent to the host) that changes with the content
        name = url.rsplit("/", 1)[-1][:100]
        validators = (head.get("etag"), head.get("last-modified"), head.get("content-length"))
        if validators[:2] == (None, None):  # its content may change unseen: nothing is reused
            return TileSource(name, f"{where}#{uuid.uuid4().hex}", Unvalidated(url))
        tag = hashlib.sha256(repr(validators).encode()).hexdigest()[:32]
        source = TileSource(name, f"{where}#{tag}", (url, tag))
        if len(self._urls) > MAX_URLS:
            self._urls.clear()
        self._urls[url] = (time.monotonic(), source)
        return source

    def output_file(self, name: str) -> Path:
        """The server's output ``name`` (of ``output:NAME``), a file under ``--output-dir``.

        Raises:
            ForbiddenInputError: no output directory, or not an output file's name.
            NotFoundError: no such file.
        """
        root = self.settings.output_dir
        if root is None:
            raise ForbiddenInputError("this server writes no outputs (no --output-dir)")
        if not _OUTPUT_NAME.fullmatch(name):
            raise ForbiddenInputError(f"output:{name[:60]}: not an output file name")
        path = root / name
        if not path.is_file():
            raise NotFoundError(f"output:{name}: not found")
        return path
