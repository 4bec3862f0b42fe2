"""Scenes uploaded for map tiles (``POST /v1/scenes``): kept under ``--output-dir``, bounded.

An upload is opened through the trust rules first (GeoTIFF only by default, checked as any
input), must be georeferenced and pass the server's check that it can feed the model (its
bands and dates, as a request's), and is written under ``<output-dir>/scenes/`` by a name the
server makes (``scn-<32 hex>.tif``). The store holds at most ``max_scenes`` scenes and
``max_scenes_mb`` of them; to make room for an upload it evicts the least recently used scenes
that are idle (none of its tiles, predictions or downloads under way), and refuses the upload
(503) only when the scenes in use leave no room. A scene also expires ``scene_ttl_s`` after its
last use (tiles, predictions, downloads: its metadata read is not a use), unless it is in use.
A scene's whole-scene prediction, when asked for, is written beside it and removed with it.
An upload that cannot be written (a full or read-only disk) is refused with 507, nothing of it
left.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rasterio.transform import array_bounds

from geoserve.engine.patch_cache import file_identity
from geoserve.errors import (
    InputError,
    NotFoundError,
    OutputSpaceError,
    PayloadTooLargeError,
    QueueFullError,
)
from geoserve.raster import tempfiles
from geoserve.raster.source import NamedBytes, open_raster
from geoserve.tiles.mercator import MAX_ZOOM, lonlat_bounds, min_zoom
from geoserve.tiles.service import TileSource

logger = logging.getLogger("geoserve.server")
SCENE_ID = re.compile(r"scn-[0-9a-f]{32}")


@dataclass
class Scene:
    """One stored scene."""

    id: str
    path: Path
    name: str
    size: int
    width: int
    height: int
    crs: str
    bounds: list[float]  # west, south, east, north in degrees
    minzoom: int
    last_used: float = field(default_factory=time.monotonic)
    users: int = 0  # the requests reading or predicting it now

    @property
    def stored_bytes(self) -> int:
        """Its bytes on disk, its prediction's included."""
        return self.size + _size(self.prediction)

    @property
    def prediction(self) -> Path:
        """Where its whole-scene class map is written."""
        return self.path.with_name(f"{self.id}_classes.tif")

    def source(self) -> TileSource:
        """The scene as a tile source (its identity: :func:`file_identity`)."""
        return TileSource(self.id, str(self.path), file_identity(str(self.path)), self.prediction)

    def describe(self, ttl_s: float) -> dict[str, Any]:
        """What ``POST /v1/scenes`` and ``GET /v1/scenes/{id}`` answer."""
        left = max(0.0, ttl_s - (time.monotonic() - self.last_used))
        return {
            "id": self.id,
            "object": "scene",
            "name": self.name,
            "width": self.width,
            "height": self.height,
            "crs": self.crs,
            "bounds": self.bounds,
            "minzoom": self.minzoom,
            "maxzoom": min(MAX_ZOOM, self.minzoom + 5),
            "predicted": self.prediction.exists(),
            "expires_in_s": round(left),
        }


class SceneStore:
    """The uploaded scenes; see the module docstring."""

    def __init__(
        self,
        root: Path,
        *,
        max_scenes: int,
        max_bytes: int,
        ttl_s: float,
        formats: tuple[str, ...],
    ) -> None:
        self.root = root
        self.max_scenes = max_scenes
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.formats = formats
        self._scenes: dict[str, Scene] = {}
        self._pending: dict[str, int] = {}  # uploads being written: their sizes
        self._lock = threading.Lock()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _store_error(root, exc) from None
        tempfiles.sweep(root)  # what a killed earlier server left half-written
        for old in root.glob("scn-*"):  # an earlier server's: their ids are gone
            _unlink(old)

    def add(
        self, data: bytes, name: str, check: Callable[[NamedBytes], None] | None = None
    ) -> Scene:
        """Check and store an upload.

        ``check`` is called with the upload once it opened as a georeferenced raster, before
        anything is written: the server's check that the scene can feed the model (its
        error, naming the upload, refuses it).

        Raises:
            PayloadTooLargeError: larger than the whole store may hold.
            QueueFullError: the scenes in use leave no room for it.
            OutputSpaceError: the store's disk is full or read-only (nothing of it is left).
            InputError, InputFormatError, RasterReadError: not a georeferenced raster allowed.
            GeoServeError: what ``check`` raises.
        """
        if len(data) > self.max_bytes:
            raise PayloadTooLargeError(
                f"scene of {len(data) / 1e6:.1f} MB: larger than the scene store "
                f"({self.max_bytes / 1e6:.0f} MB, --max-scenes-mb)"
            )
        upload = NamedBytes(data, name)
        with open_raster(upload, "bytes", formats=self.formats) as src:
            info = src.info
        if not info.is_georeferenced:
            raise InputError(f"{upload.shown}: has no CRS or transform; a map cannot place it")
        sid = f"scn-{secrets.token_hex(16)}"
        scene = Scene(
            sid,
            self.root / f"{sid}.tif",
            upload.shown,
            len(data),
            info.width,
            info.height,
            info.crs.to_string(),
            lonlat_bounds(info.crs, array_bounds(info.height, info.width, info.transform)),
            min_zoom(info.crs, info.transform, info.width, info.height),
        )
        if check is not None:
            check(upload)
        self.expire()
        with self._lock:
            evicted = self._make_room(len(data))
            self._pending[scene.id] = len(data)
        for old in evicted:
            logger.info("scene %s evicted (least recently used) for an upload", old.id)
            _remove(old)
        try:
            self._write(scene.path, data)
        except BaseException:
            with self._lock:
                del self._pending[scene.id]
            raise
        with self._lock:
            del self._pending[scene.id]
            scene.last_used = time.monotonic()
            self._scenes[scene.id] = scene
        return scene

    def _make_room(self, size: int) -> list[Scene]:
        """Take the least recently used idle scenes out until ``size`` more bytes fit.

        Called with the lock held; returns the scenes taken out (their files still there).

        Raises:
            QueueFullError: even without every idle scene it would not fit (none is taken).
        """
        count = len(self._scenes) + len(self._pending)
        used = sum(s.stored_bytes for s in self._scenes.values()) + sum(self._pending.values())
        idle = sorted((s for s in self._scenes.values() if s.users == 0), key=_last_used)
        taken: list[Scene] = []
        while (count >= self.max_scenes or used + size > self.max_bytes) and idle:
            scene = idle.pop(0)
            taken.append(scene)
            count -= 1
            used -= scene.stored_bytes
        if count >= self.max_scenes or used + size > self.max_bytes:
            busy = len(self._scenes) + len(self._pending)
            raise QueueFullError(
                f"the scene store is full: {busy} scenes in use or being uploaded hold "
                f"{used / 1e6:.1f} MB of {self.max_bytes / 1e6:.1f} MB (--max-scenes "
                f"{self.max_scenes}, --max-scenes-mb); retry when one of their requests ends"
            )
        for scene in taken:
            del self._scenes[scene.id]
        return taken

    def _write(self, path: Path, data: bytes) -> None:
        """``data`` written to ``path`` whole or not at all (OutputSpaceError when it cannot)."""
        tmp = tempfiles.new_temporary(path)
        done = False
        try:
            tmp.write_bytes(data)
            tmp.replace(path)
            done = True
        except OSError as exc:
            raise _store_error(self.root, exc) from None
        finally:
            tempfiles.release(tmp, remove=not done)

    def get(self, sid: str) -> Scene:
        """The scene ``sid`` (looking at it is no use of it: its expiry stays).

        Raises:
            NotFoundError: no such scene (never uploaded, expired or deleted).
        """
        self.expire()
        with self._lock:
            return self._find(sid)

    @contextlib.contextmanager
    def use(self, sid: str) -> Iterator[Scene]:
        """The scene ``sid``, in use for the block (a tile, prediction or download).

        It is not evicted or expired meanwhile, and its expiry counts from the block's end.

        Raises:
            NotFoundError: no such scene.
        """
        self.expire()
        with self._lock:
            scene = self._find(sid)
            scene.users += 1
        try:
            yield scene
        finally:
            with self._lock:
                scene.users -= 1
                scene.last_used = time.monotonic()

    def _find(self, sid: str) -> Scene:
        scene = self._scenes.get(sid) if SCENE_ID.fullmatch(sid) else None
        if scene is None:
            raise NotFoundError(f"scene {sid[:40]!r}: not found (it may have expired)")
        return scene

    def delete(self, sid: str) -> None:
        """Remove a scene and its prediction (NotFoundError if there is none)."""
        scene = self.get(sid)
        with self._lock:
            self._scenes.pop(scene.id, None)
        _remove(scene)

    def holds(self, scene: Scene) -> bool:
        """Whether ``scene`` is still stored (not deleted or expired)."""
        with self._lock:
            return self._scenes.get(scene.id) is scene

    def discard_files(self, scene: Scene) -> None:
        """Remove a scene's files (one that is no longer stored: what a late writer left)."""
        _remove(scene)

    def expire(self) -> None:
        """Remove the scenes unused for ``ttl_s`` seconds (none in use)."""
        now = time.monotonic()
        with self._lock:
            old = [
                s for s in self._scenes.values() if s.users == 0 and now - s.last_used > self.ttl_s
            ]
            for scene in old:
                del self._scenes[scene.id]
        for scene in old:
            _remove(scene)


def _store_error(root: Path, exc: OSError) -> OutputSpaceError:
    """A failed write in the store, as the client should read it (507: a disk problem)."""
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        problem = f"the scene store {root} is not writable"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        problem = f"the scene store {root} has no space left for the upload"
    else:
        problem = f"the scene store {root} cannot store the upload"
    logger.error("%s: %s", problem, exc)
    return OutputSpaceError(f"{problem} ({exc.strerror or exc})")


def _last_used(scene: Scene) -> float:
    return scene.last_used


def _remove(scene: Scene) -> None:
    for path in scene.path.parent.glob(f"{scene.id}*"):  # its prediction, and sidecars
        _unlink(path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("cannot remove %s: %s", path, exc)
