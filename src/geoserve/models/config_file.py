"""Reading a model's config file (YAML or JSON) as untrusted data.

Shared by the Prithvi loader and the TerraTorch fine-tune reader: YAML is read with
``yaml.safe_load`` (plain data, never Python objects), files over :data:`MAX_CONFIG_BYTES` are
refused unread, and unreadable or malformed content is a :class:`~geoserve.errors.WeightsError`
naming the file. YAML anchors and aliases make a small file a large (or endless) structure; its
size counted with every alias expanded is bounded (:data:`MAX_CONFIG_NODES`, nested at most
:data:`MAX_CONFIG_DEPTH` deep), so reading it later costs no more than a plain file would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from geoserve.errors import WeightsError

#: Larger config files are refused (published ones are a few kilobytes).
MAX_CONFIG_BYTES = 1 << 20
#: Most values a config may hold, counted with YAML aliases expanded, and deepest nesting.
MAX_CONFIG_NODES = 1 << 20  # more than a file of MAX_CONFIG_BYTES holds without aliases
MAX_CONFIG_DEPTH = 64


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
    _check_size(raw, cfg_path)
    return raw


def _check_size(raw: Any, cfg_path: Path) -> None:
    """Refuse a structure too large or deep to walk.

    Over :data:`MAX_CONFIG_NODES` values (aliases expanded), or nested deeper than
    :data:`MAX_CONFIG_DEPTH` (which a self-referring alias is).
    """
    count = 0
    stack: list[tuple[Any, int]] = [(raw, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_CONFIG_NODES:
            raise WeightsError(
                f"{cfg_path}: config holds over {MAX_CONFIG_NODES:,} values (YAML aliases "
                "expanded), refused"
            )
        if depth > MAX_CONFIG_DEPTH:
            raise WeightsError(
                f"{cfg_path}: config nested over {MAX_CONFIG_DEPTH} levels deep (or an alias "
                "refers to itself), refused"
            )
        if isinstance(node, Mapping):
            stack.extend((child, depth + 1) for item in node.items() for child in item)
        elif isinstance(node, list | tuple):
            stack.extend((child, depth + 1) for child in node)


def section(raw: Mapping[str, Any], keys: tuple[str, ...], cfg_path: Path) -> Mapping[str, Any]:
    """``raw[k0][k1]...``: a missing key gives ``{}``, anything but a mapping an error.

    The section's keys are argument names (TerraTorch passes them as keyword arguments), so
    each must be a string.

    Raises:
        WeightsError: a level on the way is not a mapping, or the section has a key that is
            not a string, naming it and the file.
    """
    node: Any = raw
    for i, key in enumerate(keys):
        node = node.get(key, {})
        if not isinstance(node, Mapping):
            where = ".".join(keys[: i + 1])
            raise WeightsError(f"{cfg_path}: malformed config ({where} is not a mapping)")
    odd = [k for k in node if not isinstance(k, str)]
    if odd:
        raise WeightsError(
            f"{cfg_path}: {'.'.join(keys)}: key {str(odd[0])[:40]!r} is not a name (these keys "
            "are argument names; quote it if it is one)"
        )
    return cast(Mapping[str, Any], node)
