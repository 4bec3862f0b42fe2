"""The on-disk cache of converted models (``backend: openvino``); no torch, no OpenVINO here.

A converted model is a folder ``<cache>/<model>-<key>/`` holding OpenVINO's ``model.xml`` and
``model.bin`` and ``meta.json``: what it was converted from (the key's parts: weights hash,
input shape, backend, precision, library versions, the calibration patches' hash), how long
the conversion and calibration took, and the accuracy gate's figures against torch fp32. The
key is a hash of those parts, so a change of any of them converts again. A folder is written
under a temporary name and renamed into place, so a reader never sees half of one.
``geoserve models --json`` lists a model's converted forms (:func:`converted_of`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The file of a converted model that holds what it is and how it did.
META = "meta.json"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/geoserve/converted``, else ``~/.cache/geoserve/converted``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "geoserve" / "converted"


def cache_key(parts: Mapping[str, Any]) -> str:
    """The hash of a converted model's parts (16 hex digits)."""
    text = json.dumps(dict(parts), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def entry_dir(cache_dir: Path, model: str, key: str) -> Path:
    """The folder of one converted model (the model's name made safe for a file name)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
    return cache_dir / f"{safe}-{key}"


def read_meta(folder: Path) -> dict[str, Any] | None:
    """A converted model's ``meta.json``, or None when it is missing or unreadable."""
    try:
        data = json.loads((folder / META).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def publish(tmp: Path, folder: Path) -> None:
    """Move a finished conversion ``tmp`` into place as ``folder`` (another's wins a race)."""
    try:
        tmp.rename(folder)
    except OSError:  # (written meanwhile by another process: keep theirs)
        shutil.rmtree(tmp, ignore_errors=True)


def new_tmp(cache_dir: Path) -> Path:
    """A fresh temporary folder in ``cache_dir`` for one conversion.

    Raises:
        OSError: the cache folder cannot be created.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def write_meta(folder: Path, meta: Mapping[str, Any]) -> None:
    """Write ``meta.json`` into ``folder``."""
    (folder / META).write_text(json.dumps(dict(meta), indent=2, sort_keys=True, default=str))


def converted_of(model: str, cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """The converted forms of ``model`` in the cache: each one's ``meta.json`` and folder."""
    root = cache_dir or default_cache_dir()
    found = []
    try:
        folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    for folder in folders:
        meta = read_meta(folder)
        if meta is not None and meta.get("model") == model:
            found.append({**meta, "path": str(folder)})
    return found
