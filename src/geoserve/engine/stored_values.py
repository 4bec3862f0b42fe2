"""A request's values as plain JSON and back, every stored value checked as untrusted.

What :meth:`~geoserve.engine.request_spec.RequestSpec.to_json` writes and
:meth:`~geoserve.engine.request_spec.RequestSpec.from_json` reads: inputs (paths and URLs as
text, bytes and uploads as base64 with the name they are reported by, a window of a file as its
path, name and offsets, a STAC Item as its JSON and where it was read from), dates as ISO text,
and typed fields read back with an error naming the field.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rasterio.windows import Window

from geoserve.errors import InputError
from geoserve.raster.input_values import NamedBytes, RasterWindow
from geoserve.raster.stac_item import StacItem, is_stac_input
from geoserve.stac_query import StacSearch


def dates_json(dates: Any) -> Any:
    """Normalised dates (a list of dates or None, or a dict of them) as ISO text."""
    if dates is None:
        return None
    if isinstance(dates, Mapping):
        return {k: dates_json(v) for k, v in dates.items()}
    return [None if d is None else d.isoformat() for d in dates]


def stored(value: Any, where: str) -> Any:
    """One input as a plain JSON value.

    Raises:
        InputError: naming ``where``, for an input that is not a file's reference or bytes.
    """
    if isinstance(value, str):
        return value  # a path, URL or base64 text (read as the spec's data_format says)
    if isinstance(value, NamedBytes):
        return {"bytes": _b64(value.data), "name": value.name}
    if isinstance(value, bytes):
        return {"bytes": _b64(value)}
    if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
        return {"path": os.fspath(value)}
    if isinstance(value, RasterWindow):
        return {"window": [value.path, value.name, *map(_number, value.window.flatten())]}
    if isinstance(value, StacSearch):  # (its guards are the server's: given again on restore)
        return {"stac_search": value.to_json()}
    if is_stac_input(value):  # a StacItem or a pystac.Item (not a file's name)
        item = StacItem.of(value)
        return {"stac_item": dict(item.data), "location": item.location}
    raise InputError(
        f"{where}: a {type(value).__name__} cannot be stored (give a path, URL, base64 text, "
        "bytes, a STAC Item or a STAC search)"
    )


def restored_list(value: Any, where: str) -> list[Any]:
    """A stored list of inputs, each :func:`restored` (``where``: its name in messages)."""
    if not isinstance(value, list):
        raise InputError(f"request spec: {where} must be a list")
    return [restored(x, f"{where}[{i}]") for i, x in enumerate(value)]


def restored(value: Any, where: str) -> Any:
    """One input as :func:`stored` wrote it.

    Raises:
        InputError: naming ``where``, for anything :func:`stored` does not write.
    """
    if isinstance(value, str):
        return value
    keys = set(value) if isinstance(value, Mapping) else set()
    if keys in ({"bytes"}, {"bytes", "name"}):
        data = _unb64(value["bytes"], where)
        if "name" not in keys:
            return data
        if not isinstance(value["name"], str):
            raise InputError(f"request spec: {where}: 'name' must be text")
        return NamedBytes(data, value["name"])
    if keys == {"path"} and isinstance(value["path"], str):
        return Path(value["path"])
    if keys == {"window"}:
        parts = value["window"]
        if (
            isinstance(parts, list)
            and len(parts) == 6
            and all(isinstance(p, str) for p in parts[:2])
            and all(isinstance(p, int | float) and not isinstance(p, bool) for p in parts[2:])
        ):
            return RasterWindow(parts[0], Window(*parts[2:]), parts[1])
    if keys == {"stac_search"}:
        return StacSearch.from_json(value["stac_search"])
    if keys in ({"stac_item"}, {"stac_item", "location"}):
        location = value.get("location")
        if location is None or isinstance(location, str):
            return StacItem(value["stac_item"], location)  # (checked as any Item input)
    raise InputError(
        f"request spec: {where} is not a stored input (text, or an object of 'bytes', "
        "'path', 'window', 'stac_item' or 'stac_search')"
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any, where: str) -> bytes:
    if isinstance(text, str):
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise InputError(f"request spec: {where}: 'bytes' must be base64 text")


def _number(x: float) -> int | float:
    """A window offset or size as JSON keeps it (a whole number as an int)."""
    return int(x) if float(x).is_integer() else float(x)


def field_of(data: Mapping[str, Any], name: str, kind: type) -> Any:
    """``data[name]``, None when absent or null, else of ``kind`` (a bool is no number)."""
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InputError(f"request spec: {name!r} must be {_KIND_WORDS[kind]}")
    return value


def choice_of(data: Mapping[str, Any], name: str, choices: tuple[str, ...], default: str) -> Any:
    """``data[name]``, one of ``choices`` (``default`` when absent)."""
    value = field_of(data, name, str)
    if value is None:
        return default
    if value not in choices:
        raise InputError(f"request spec: {name!r} must be one of {', '.join(choices)}")
    return value


def items_of(data: Mapping[str, Any], name: str, kinds: tuple[type, ...]) -> list[Any] | None:
    """``data[name]``: None, or a list whose entries are all of ``kinds`` (no bools)."""
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, kinds) and not isinstance(v, bool) for v in value
    ):
        words = " or ".join(_KIND_WORDS[k] for k in kinds)
        raise InputError(f"request spec: {name!r} must be a list, each entry {words}")
    return value


_KIND_WORDS: dict[type, str] = {str: "text", int: "an integer"}
