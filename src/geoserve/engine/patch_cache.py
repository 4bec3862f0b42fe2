"""A cache of the model's outputs per patch, for requests that ask for one (map tiles).

Map tiles of one scene overlap in patches: neighbouring tiles, and the same area at the next
zoom level, need many of the same patches. A request given a :class:`PatchKeys` names each of
its patches by a key that identifies the patch's input (the scene's identity and the patch's
place on the scene's own grid); :meth:`PatchCache.split` takes the patches whose output is
cached out of a batch before the forward pass, and :meth:`PatchCache.remember` keeps the
outputs of those that ran. The cache is bounded in bytes and forgets the least recently used
patch first (``cachetools.LRUCache``); it is shared by the requests that hold it and used only
from the engine's thread, with a lock for the counters read elsewhere.

A scene's identity must change whenever its content may have: :func:`file_identity` for a
file (its device, inode, size, and modification and change times: a file replaced by one of
the same size with its modification time restored, ``cp -p`` or ``rsync -t``, still has a new
change time, which no user can set back), the URL with its validators for a remote scene; a
scene with no validator (a URL answered without ``ETag`` or ``Last-Modified``) gets an
:class:`Unvalidated` identity, and its patches are neither looked up nor kept.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch
from cachetools import LRUCache
from numpy.typing import NDArray

from geoserve.engine import transfer
from geoserve.engine.batch import BatchOutput, Patch


class PatchCache:
    """Model outputs (C, P, P) float32 by patch key, at most ``max_bytes`` of them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lru: LRUCache[Hashable, NDArray[np.float32]] = LRUCache(
            maxsize=max(1, max_bytes), getsizeof=lambda a: max(1, a.nbytes)
        )
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        """Bytes held."""
        with self._lock:
            return int(self._lru.currsize)

    def split(
        self, batch: list[Patch], device: torch.device
    ) -> tuple[list[Patch], BatchOutput | None]:
        """``batch`` without the patches whose output is cached, and those as an output."""
        rest: list[Patch] = []
        hits: list[Patch] = []
        outs: list[NDArray[np.float32]] = []
        with self._lock:
            for patch in batch:
                keys = patch.request.patch_keys
                key = keys.key(patch.row, patch.col) if keys and keys.cache is self else None
                found = self._lru.get(key) if _reusable(key) else None
                if found is None:
                    rest.append(patch)
                    self.misses += key is not None
                else:
                    hits.append(patch)
                    outs.append(found)
                    self.hits += 1
        if not hits:
            return batch, None
        host = np.stack(outs)
        return rest, BatchOutput(hits, torch.from_numpy(host).to(device), host)

    def remember(self, part: BatchOutput) -> None:
        """Keep the outputs of ``part``'s patches that have a key for this cache."""
        if part.out is None:
            return
        host = part.host
        with self._lock:
            for i, patch in enumerate(part.patches):
                keys = patch.request.patch_keys
                if keys is None or keys.cache is not self:
                    continue
                key = keys.key(patch.row, patch.col)
                if not _reusable(key):
                    continue
                if host is None:  # stitched on the device: one copy of the part, not per patch
                    host = transfer.to_host(part.out).wait()
                out = host[i]
                value = np.array(out, dtype=np.float32, copy=True)
                if value.nbytes <= self.max_bytes:
                    self._lru[key] = value


class Unvalidated:
    """The identity of a scene whose content cannot be told from a changed one.

    Each instance equals only itself; a patch key holding one (see :class:`PatchKeys`) is
    never looked up or kept, so such a scene's patches always run.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Unvalidated({self.name!r})"


def file_identity(path: str) -> tuple[str, int, int, int, int, int]:
    """A file's identity for the cache: its path, device, inode, size, mtime and ctime.

    Raises:
        OSError: the file cannot be stat'ed.
    """
    st = os.stat(path)
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _reusable(key: Hashable | None) -> bool:
    """Whether a patch key may be looked up and kept (none that names an unvalidated scene)."""
    if key is None:
        return False
    parts = key if isinstance(key, tuple) else (key,)
    return not any(isinstance(part, Unvalidated) for part in parts)


def split_cached(
    batch: list[Patch], device: torch.device
) -> tuple[list[Patch], list[BatchOutput], list[PatchCache]]:
    """The patches to run, the cached outputs of the others, and the caches involved."""
    caches: list[PatchCache] = []
    for patch in batch:
        keys = patch.request.patch_keys
        if keys is not None and all(keys.cache is not c for c in caches):
            caches.append(keys.cache)
    found: list[BatchOutput] = []
    for cache in caches:
        batch, part = cache.split(batch, device)
        if part is not None:
            found.append(part)
    return batch, found, caches


def remember_all(caches: list[PatchCache], part: Any) -> None:
    """Keep ``part``'s outputs in every cache of its requests."""
    for cache in caches:
        cache.remember(part)
