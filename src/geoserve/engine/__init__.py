"""The batching engine (no web code here)."""

from geoserve.engine.core import Engine
from geoserve.engine.model_loader import build_model, resolve_model

__all__ = ["Engine", "build_model", "resolve_model"]
