"""The batching engine (no web code here)."""

from geoserve.engine.core import Engine, resolve_model

__all__ = ["Engine", "resolve_model"]
