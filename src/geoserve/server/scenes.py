"""Scenes uploaded for map tiles (``POST /v1/scenes``): kept under ``--output-dir``, bounded.

An upload is opened through the trust rules first (GeoTIFF only by default, checked as any
input), must be georeferenced, and is written under ``<output-dir>/scenes/`` by a name the
server makes (``scn-<32 hex>.tif``). The store holds at most ``max_scenes`` scenes and
``max_scenes_mb`` of them; a full store refuses new uploads (503) until scenes expire,
``scene_ttl_s`` after their last use, or are deleted. A scene's whole-scene prediction, when
asked for, is written beside it and removed with it.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rasterio.transform import array_bounds

from geoserve.errors import InputError, NotFoundError, PayloadTooLargeError, QueueFullError
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

    @property
    def prediction(self) -> Path:
        """Where its whole-scene class map is written."""
        return self.path.with_name(f"{self.id}_classes.tif")

    def source(self) -> TileSource:
        """The scene as a tile source (its identity: the file's name, size and time)."""
        stat = self.path.stat()
        identity = (str(self.path), stat.st_mtime_ns, stat.st_size)
        return TileSource(self.id, str(self.path), identity, self.prediction)

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
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        for old in root.glob("scn-*"):  # an earlier server's: their ids are gone
            _unlink(old)

    def add(self, data: bytes, name: str) -> Scene:
        """Check and store an upload.

        Raises:
            PayloadTooLargeError: larger than the whole store may hold.
            QueueFullError: the store is full (it names when room frees up).
            InputError, InputFormatError, RasterReadError: not a georeferenced raster allowed.
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
        self.expire()
        with self._lock:
            used = sum(s.size + _size(s.prediction) for s in self._scenes.values())
            if len(self._scenes) >= self.max_scenes or used + len(data) > self.max_bytes:
                raise QueueFullError(
                    f"the scene store is full ({len(self._scenes)} scenes, {used / 1e6:.0f} MB "
                    f"of {self.max_bytes / 1e6:.0f} MB); delete a scene or retry when one "
                    f"expires ({self.ttl_s:.0f} s after its last use)"
                )
            sid = f"scn-{secrets.token_hex(16)}"
            path = self.root / f"{sid}.tif"
            tmp = tempfiles.new_temporary(path)
            try:
                tmp.write_bytes(data)
                tmp.replace(path)
            finally:
                tempfiles.release(tmp, remove=not path.exists())
            scene = Scene(
                sid,
                path,
                upload.shown,
                len(data),
                info.width,
                info.height,
                info.crs.to_string(),
                lonlat_bounds(info.crs, array_bounds(info.height, info.width, info.transform)),
                min_zoom(info.crs, info.transform, info.width, info.height),
            )
            self._scenes[sid] = scene
        return scene

    def get(self, sid: str) -> Scene:
        """The scene ``sid``, its expiry pushed back.

        Raises:
            NotFoundError: no such scene (never uploaded, expired or deleted).
        """
        self.expire()
        with self._lock:
            scene = self._scenes.get(sid) if SCENE_ID.fullmatch(sid) else None
            if scene is None:
                raise NotFoundError(f"scene {sid[:40]!r}: not found (it may have expired)")
            scene.last_used = time.monotonic()
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
        """Remove the scenes unused for ``ttl_s`` seconds."""
        now = time.monotonic()
        with self._lock:
            old = [s for s in self._scenes.values() if now - s.last_used > self.ttl_s]
            for scene in old:
                del self._scenes[scene.id]
        for scene in old:
            _remove(scene)


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
