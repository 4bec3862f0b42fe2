"""The HTTP server (extra ``geoserve[server]``): FastAPI routes over the async engine.

Its names are imported on first use, so reading :mod:`geoserve.server.settings` (the command
line does, for its flags) loads neither the web framework nor torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["ServerSettings", "create_app"]

_WHERE = {"create_app": "geoserve.server.app", "ServerSettings": "geoserve.server.settings"}

if TYPE_CHECKING:
    from geoserve.server.app import create_app
    from geoserve.server.settings import ServerSettings
else:

    def __getattr__(name: str) -> Any:
        if name in _WHERE:
            return getattr(importlib.import_module(_WHERE[name]), name)
        raise AttributeError(f"module 'geoserve.server' has no attribute {name!r}")
