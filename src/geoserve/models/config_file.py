"""Reading a model's config file (YAML or JSON) as untrusted data.

Shared by the Prithvi loader and the TerraTorch fine-tune reader: YAML is read with
``yaml.safe_load`` (plain data, never Python objects), files over :data:`MAX_CONFIG_BYTES` are
refused unread, and unreadable or malformed content is a :class:`~geoserve.errors.WeightsError`
naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from geoserve.errors import WeightsError

#: Larger config files are refused (published ones are a few kilobytes).
MAX_CONFIG_BYTES = 1 << 20


def read_mapping(cfg_path: Path) -> Mapping[str, Any]:
    """The mapping a config file holds: JSON for ``.json``, else YAML.

    Raises:
        WeightsError: the file is missing, too large, unreadable, malformed, or not a mapping.
    """
    if not cfg_path.is_file():
        raise WeightsError(f"{cfg_path}: config file not found")
    try:
        with cfg_path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise WeightsError(f"{cfg_path}: cannot read config ({exc.strerror or exc})") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise WeightsError(f"{cfg_path}: config over {MAX_CONFIG_BYTES >> 20} MB, refused")
    if cfg_path.suffix.lower() == ".json":
        loads: Any = json.loads
    else:
        try:
            import yaml
        except ImportError:
            raise WeightsError(
                f"{cfg_path}: reading YAML configs needs PyYAML (pip install pyyaml)"
            ) from None
        loads = yaml.safe_load
    try:
        raw = loads(data.decode("utf-8"))
    except Exception as exc:  # decode, syntax, nesting: all one error for the user
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"{cfg_path}: cannot parse config ({detail})") from exc
    if not isinstance(raw, Mapping):
        raise WeightsError(f"{cfg_path}: config must be a mapping, got {type(raw).__name__}")
    return raw


def section(raw: Mapping[str, Any], keys: tuple[str, ...], cfg_path: Path) -> Mapping[str, Any]:
    """``raw[k0][k1]...``: a missing key gives ``{}``, anything but a mapping an error.

    Raises:
        WeightsError: a level on the way is not a mapping, naming it and the file.
    """
    node: Any = raw
    for i, key in enumerate(keys):
        node = node.get(key, {})
        if not isinstance(node, Mapping):
            where = ".".join(keys[: i + 1])
            raise WeightsError(f"{cfg_path}: malformed config ({where} is not a mapping)")
    return cast(Mapping[str, Any], node)
