"""Temporary output files: how they are named, and how none is ever left behind for long.

An output is written to ``.<target name>.<host>-<pid>-<random>.tmp`` beside its target and
renamed into place when complete. A temporary that cannot be removed when its request fails
(its directory turned read-only, say) is remembered and removed by the next writer of this
process once it can be; one left by a process that was killed (SIGKILL, a crash) is recognised
by its process id and age and removed by :func:`sweep` (each file writer sweeps beside its
target, the server its output directory at start-up). Only temporaries of this host (a hash of
its full name) are ever swept: on a shared file system another host's process ids mean nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)

_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:12]
#: A temporary of a dead process is removed only once it is this old: containers that share a
#: host name (host networking) do not share process ids, so a live writer elsewhere must look
#: idle for this long before its file can be taken for a leftover.
STALE_AFTER_S = 600.0
_PATTERN = re.compile(
    r"^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)-[0-9a-f]{8}\.tmp(?:\.[A-Za-z0-9]+)?$"
)
_lock = threading.Lock()
_live: set[Path] = set()  # temporaries of this process still being written
_orphans: set[Path] = set()  # temporaries of this process that could not be removed yet


def new_temporary(target: Path, suffix: str = "") -> Path:
    """A fresh temporary name beside ``target``, registered as live.

    ``suffix`` (``.gpkg``) ends the name, for a writer that wants its format's extension.

    A ``target`` that is itself a temporary (a file written by way of another, as the
    polygons' class map is) gets a name of the same final target, not a prefix on a prefix.
    """
    match = _PATTERN.match(target.name)
    name = match["name"] if match is not None else target.name
    tmp = target.with_name(f".{name}.{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{suffix}")
    with _lock:
        _live.add(tmp)
    return tmp


def release(tmp: Path, *, remove: bool) -> None:
    """``tmp`` is no longer written: remove it (or it was renamed into place). Never raises."""
    with _lock:
        _live.discard(tmp)
    if not remove:
        return
    try:
        tmp.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("cannot remove temporary output %s now (%s); will retry", tmp, exc)
        with _lock:
            _orphans.add(tmp)


def retry_orphans() -> None:
    """Remove the temporaries this process could not remove before."""
    with _lock:
        pending = list(_orphans)
    for tmp in pending:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            continue
        with _lock:
            _orphans.discard(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep(directory: Path, *target_names: str) -> int:
    """Remove stale temporaries of geoserve's naming in ``directory``; returns how many.

    Stale: its process is gone (and the file untouched for :data:`STALE_AFTER_S`), or it is
    this process's and no longer being written. With ``target_names``, only the temporaries
    of those targets (a file and its sidecar, say). Never raises.
    """
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        match = _PATTERN.match(entry.name)
        if match is None or match["host"] != _HOST:
            continue
        if target_names and match["name"] not in target_names:
            continue
        path = Path(entry.path)
        pid = int(match["pid"])
        with _lock:
            ours_live = path in _live
        if (pid == os.getpid() and ours_live) or (pid != os.getpid() and _alive(pid)):
            continue
        try:
            if pid != os.getpid() and time.time() - entry.stat().st_mtime < STALE_AFTER_S:
                continue
        except OSError:
            continue
        try:
            path.unlink(missing_ok=True)
            removed += 1
        except OSError:
            continue
    if removed:
        logger.info("removed %d stale temporary output(s) in %s", removed, directory)
    return removed
