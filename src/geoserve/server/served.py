"""The served models' engines: one :class:`~geoserve.engine.AsyncEngine` per model.

Each model has its own engine, loop thread and batching, so a batch never mixes models and a
model's failure (a forward pass that raises, an out-of-memory error) fails only its own
requests. They share the server's one memory bound (``max_memory_mb``: one
:class:`~geoserve.engine.ledger.MemoryLedger` for all); each has its own admission bound
(``max_queued_patches``) and admission threads. A request names its model (:meth:`pick`):
with one model served the name may be left out; with several, a request without one is a 400
listing them, and a name not served is a 404 listing those that are.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from geoserve.engine import Engine
from geoserve.engine.async_engine import AsyncEngine
from geoserve.engine.ledger import MemoryLedger
from geoserve.errors import (
    ConfigError,
    InputError,
    ShuttingDownError,
    UnknownModelError,
)
from geoserve.server.metrics import Metrics
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")


class ServedEngines:
    """The engines of ``settings.served``, built by :meth:`load`, found by model name.

    ``state``: the app's shared state; ``state["engine"]`` is the first model's engine (the
    one model's, as it always was) once every model has loaded, ``state["load_error"]`` the
    first failure.
    """

    def __init__(
        self,
        settings: ServerSettings,
        metrics: Metrics,
        state: dict[str, Any],
        given: Engine | None = None,
    ) -> None:
        self.settings = settings
        self.names = settings.model_names
        if given is not None and len(self.names) > 1:
            raise ConfigError("an engine given to create_app serves one model; not with models")
        self.metrics = metrics
        self.state = state
        self._given = given
        self.engines: dict[str, AsyncEngine] = {}
        self.errors: dict[str, BaseException] = {}
        self._ledger = MemoryLedger(int(settings.max_memory_mb * 1024 * 1024))

    @property
    def several(self) -> bool:
        """Whether more than one model is served."""
        return len(self.names) > 1

    def load(self) -> None:
        """Build every model's engine in turn (one that fails to load leaves the others)."""
        s = self.settings
        label = self.metrics.by_model
        for served in s.served:
            name = served.name
            try:
                eng = self._given or Engine(name, served.engine)
                async_engine = AsyncEngine(
                    eng,
                    max_queued_patches=s.max_queued_patches,
                    max_pixels=s.max_pixels,
                    max_memory_mb=s.max_memory_mb,
                    max_wait_ms=s.max_wait_ms,
                    on_batch=functools.partial(
                        self.metrics.observe_batch, model=name if label else None
                    ),
                    admission_threads=s.admission_threads,
                )
                if self.several:  # one bound for the whole server, not one per model
                    async_engine.memory = self._ledger
                self.metrics.bind(
                    functools.partial(_remaining, async_engine),
                    functools.partial(_in_flight, async_engine),
                    steps=eng.step_stats,
                    model=name if label else None,
                )
                self.engines[name] = async_engine
                logger.info("model %s ready", name)
            except Exception as exc:  # reported by /health/ready and every request for it
                logger.exception("model %s failed to load", name)
                self.errors[name] = exc
        if self.errors:
            first, why = next(iter(self.errors.items()))
            self.state["load_error"] = (
                why if not self.several else ConfigError(f"model {first!r} failed to load: {why}")
            )
        if self.engines:  # (the first model's engine: its memory ledger is the server's)
            self.state["engine"] = self.engines.get(s.model) or next(iter(self.engines.values()))

    def pick(self, model: str | None) -> str:
        """The served model a request names (``None``: the one model, if only one is served).

        Raises:
            InputError: several models are served and ``model`` is ``None`` (400, listing them).
            UnknownModelError: ``model`` is not served here (404, listing those that are).
        """
        if model is None:
            if not self.several:
                return self.names[0]
            raise InputError(
                f"model: this server serves {len(self.names)} models; name one with "
                f'"model": {", ".join(self.names)}'
            )
        if model not in self.names:
            err = UnknownModelError(model[:80], self.names)
            err.args = (f"unknown model {model[:80]!r}; served here: {', '.join(self.names)}",)
            raise err
        return model

    def ready(self, model: str | None = None) -> AsyncEngine:
        """The engine of the model a request names, or the reason there is none yet."""
        name = self.pick(model)
        if name in self.errors:
            raise ConfigError(f"model {name!r} failed to load: {self.errors[name]}")
        eng = self.engines.get(name)
        if eng is None:
            raise ShuttingDownError(f"model {name!r} is still loading")
        return eng

    def crashed(self) -> tuple[str, BaseException] | None:
        """A model whose engine loop stopped, and why (never expected)."""
        for name, eng in list(self.engines.items()):
            if eng.crashed is not None:
                return name, eng.crashed
        return None

    def progress(self, request_id: str) -> tuple[int, int] | None:
        """(patches done, patches in all) of an admitted request, whichever model runs it."""
        for eng in list(self.engines.values()):
            counted = eng.progress(request_id)
            if counted is not None:
                return counted
        return None

    def close(self) -> None:
        """Stop every engine."""
        for eng in list(self.engines.values()):
            eng.close()


def _remaining(eng: AsyncEngine) -> float:
    return eng.remaining_patches


def _in_flight(eng: AsyncEngine) -> float:
    return eng.in_flight
