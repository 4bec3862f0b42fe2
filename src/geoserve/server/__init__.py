"""The HTTP server (extra ``geoserve[server]``): FastAPI routes over the async engine."""

from geoserve.server.app import create_app
from geoserve.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
