"""The batching engine (no web code here)."""

from geoserve.engine.core import Engine
from geoserve.engine.model_loader import build_model, resolve_model
from geoserve.engine.request_spec import RequestSpec

__all__ = ["Engine", "RequestSpec", "build_model", "resolve_model"]
