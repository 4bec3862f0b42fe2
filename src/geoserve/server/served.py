"""The served models' engines: one :class:`~geoserve.engine.AsyncEngine` per model.

Each model has its own engine, loop thread, batching, admission bound and threads, so a batch
never mixes models and a model's failure fails only its own requests. They share the server's
one memory bound (``max_memory_mb``: one :class:`~geoserve.engine.ledger.MemoryLedger`) and,
with several models on an accelerator (or ``device_turns``), the device: each batch takes a
turn (:class:`~geoserve.engine.turns.Turns`, weighted by each model's ``share``), so a flooded
model cannot starve the others. A request names its model (:meth:`pick`).

Everything that uses an engine holds a lease on it (:meth:`lease`, or :meth:`hold` in a
thread) for as long as it does: a request, a job, a tile, a description. Within a budget
(``max_loaded_models``, and ``max_loaded_mb``: each model's weights measured at its load, a
tensor shared between models counted once), a lease on a model not loaded loads it (one load
per model; the others asking meanwhile wait for it), first unloading the least recently used
models no lease holds (after the load, when its size is not yet known; while the models that
would make room are busy, once one is let go). When every loaded model is held, the lease
waits for one to be let go (until the request's deadline: 503). A model that fails to load
fails its own requests (500, saying why), never the others'.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from geoserve.engine import Engine
from geoserve.engine.async_engine import AsyncEngine
from geoserve.engine.ledger import MemoryLedger
from geoserve.engine.shared_weights import resident_bytes
from geoserve.engine.turns import Turns
from geoserve.errors import (
    ConfigError,
    InputError,
    ModelLoadError,
    QueueFullError,
    ShuttingDownError,
    UnknownModelError,
)
from geoserve.server.metrics import Metrics
from geoserve.server.model_entry import model_entry
from geoserve.server.settings import ServerSettings

logger = logging.getLogger("geoserve.server")

#: The model the current request's ``serve_multiplexed_model_id`` header names (Ray Serve's;
#: :data:`geoserve.job_wire.MODEL_HEADER`), set by the guard middleware.
HEADER_MODEL: ContextVar[str | None] = ContextVar("geoserve_header_model", default=None)

#: How often a lease waiting for a model to load (or for room to load it) looks again.
POLL_S = 0.02


class ServedEngines:
    """The engines of ``settings.served``, loaded at start-up (:meth:`load`) or on first use.

    ``state``: the app's shared state; ``state["ledger"]`` is the server's memory bound,
    ``state["started"]`` is set once the start-up loads are done, ``state["load_error"]`` the
    first of their failures.
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
        #: The loaded models' engines, least recently leased first.
        self.engines: OrderedDict[str, AsyncEngine] = OrderedDict()
        #: Models that failed to load, and why (their requests fail with it).
        self.errors: dict[str, BaseException] = {}
        #: Called with a model's name when it is unloaded (drop what refers to its engine).
        self.on_unload: list[Callable[[str], None]] = []
        self._ledger = MemoryLedger(int(settings.max_memory_mb * 1024 * 1024))
        state["ledger"] = self._ledger
        shares = {m.name: m.share for m in settings.served}
        self.turns = Turns(shares) if settings.takes_turns else None
        self.max_loaded = settings.max_loaded_models if given is None else None
        mb = settings.max_loaded_mb if given is None else None
        self.max_bytes = None if mb is None else int(mb * 2**20)
        #: Each model's bytes of weights as measured at its last load (the room a reload needs).
        self.sizes: dict[str, int] = {}
        self._over = False  # (over max_bytes after a load: trimmed when a lease is let go)
        self._lock = threading.Lock()
        self._users: Counter[str] = Counter()
        self._loading: set[str] = set()
        self._entries: dict[str, dict[str, Any]] = {}
        self._started = False
        self._closed = False

    @property
    def several(self) -> bool:
        """Whether more than one model is served."""
        return len(self.names) > 1

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """The start-up loads: ``settings.preloaded`` in turn (one that fails leaves the rest)."""
        first = self.settings.preloaded
        with self._lock:
            self._loading.update(first)
        for name in first:
            self._load(name, [])
        failed = [n for n in first if n in self.errors]
        if failed:
            why = self.errors[failed[0]]
            self.state["load_error"] = (
                why
                if not self.several
                else ConfigError(f"model {failed[0]!r} failed to load: {why}")
            )
        self._started = True
        self.state["started"] = True

    def _build(self, name: str) -> AsyncEngine:
        """``name``'s engine, built and started, its gauges bound."""
        s = self.settings
        label = name if self.metrics.by_model else None
        eng = self._given or Engine(name, s.engine_of(name))
        async_engine = AsyncEngine(
            eng,
            max_queued_patches=s.max_queued_patches,
            max_pixels=s.max_pixels,
            max_memory_mb=s.max_memory_mb,
            max_wait_ms=s.max_wait_ms,
            on_batch=functools.partial(self.metrics.observe_batch, model=label),
            admission_threads=s.admission_threads,
            turns=self.turns,
            name=name,
        )
        async_engine.memory = self._ledger  # (one bound for the whole server)
        self.metrics.bind(
            lambda: async_engine.remaining_patches,
            lambda: async_engine.in_flight,
            steps=eng.step_stats,
            model=label,
        )
        return async_engine

    def _load(self, name: str, victims: list[tuple[str, AsyncEngine]]) -> None:
        """Unload ``victims``, then load ``name`` (in the thread of whoever asked first)."""
        for old, eng in victims:
            self._unload(old, eng)
        t0 = time.perf_counter()
        try:
            eng = self._build(name)
        except Exception as exc:  # reported by every request for it (and /health/ready)
            logger.exception("model %s failed to load", name)
            with self._lock:
                self.errors[name] = exc
                self._loading.discard(name)
            return
        size = resident_bytes([eng.engine.model])
        if self.max_bytes is not None and size > self.max_bytes:
            eng.close()
            with self._lock:
                self.errors[name] = ConfigError(
                    f"its weights take {size / 2**20:.1f} MB, more than --max-loaded-mb "
                    f"{self.settings.max_loaded_mb:g} allows"
                )
                self._loading.discard(name)
            logger.error("model %s failed to load: %s", name, self.errors[name])
            return
        entry = model_entry(name, eng)
        with self._lock:
            self.engines[name] = eng
            self.sizes[name] = size
            self._entries[name] = entry
            self._loading.discard(name)
            closed = self._closed
            extra = [] if closed else self._trim(keep=name)
        if closed:  # (the server stopped while it loaded)
            eng.close()
            return
        for old, other in extra:
            self._unload(old, other)
        seconds = time.perf_counter() - t0
        self.metrics.model_loaded(name, seconds)
        logger.info("model %s ready (loaded in %.1f s)", name, seconds)

    def _unload(self, name: str, eng: AsyncEngine) -> None:
        """Stop ``name``'s engine and let its weights go (no lease holds it)."""
        eng.close()
        label = name if self.metrics.by_model else None
        self.metrics.bind(lambda: 0.0, lambda: 0.0, steps=None, model=label)
        for forget in self.on_unload:
            forget(name)
        del eng
        gc.collect()
        _empty_device_cache()
        self.metrics.model_unloaded(name)
        logger.info("model %s unloaded (least recently used)", name)

    def _resident(self, leaving: Sequence[str] = ()) -> int:
        """Bytes of weights held by the loaded models but ``leaving``, and those loading.

        (A loading model counts with its size from an earlier load. Under the lock.)
        """
        kept = [e.engine.model for n, e in self.engines.items() if n not in leaving]
        return resident_bytes(kept) + sum(self.sizes.get(n, 0) for n in self._loading)

    def _idle(self) -> list[str]:
        """The loaded models no lease holds and with nothing in flight, least recent first."""
        return [n for n, e in self.engines.items() if not self._users[n] and not e.in_flight]

    def _trim(self, keep: str | None = None) -> list[tuple[str, AsyncEngine]]:
        """Idle models taken out until the loaded ones fit in ``max_bytes``, to be unloaded.

        (Least recently used first; ``keep`` stays. Under the lock.)
        """
        if self.max_bytes is None:
            return []
        idle = [n for n in self._idle() if n != keep]
        leaving: list[str] = []
        while self._resident(leaving) > self.max_bytes and idle:
            leaving.append(idle.pop(0))
        self._over = self._resident(leaving) > self.max_bytes
        if self._over:
            logger.warning(
                "the loaded models' weights exceed --max-loaded-mb %g until a busy one is idle",
                self.settings.max_loaded_mb,
            )
        return [(n, self.engines.pop(n)) for n in leaving]

    # -- leases --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(
        self, model: str | None, timeout: float | None = None
    ) -> AsyncIterator[AsyncEngine]:
        """The engine of the model a request names, loaded and kept loaded while held.

        Waits (``timeout``, default ``request_timeout_s``) while the model loads on demand or
        while every loaded model is held and there is no room to load it; during the start-up
        loads it does not wait (503, as ``/health/ready`` says).

        Raises:
            InputError, UnknownModelError: as :meth:`pick`.
            ModelLoadError: the model failed to load (why).
            ShuttingDownError: it is still loading at the deadline, or the server stops.
            QueueFullError: no room to load it before the deadline (every loaded model busy).
        """
        name = self.pick(model)
        eng = self._claim(name)
        if eng is None and not self._started:  # (start-up: 503 at once, as /health/ready says)
            raise ShuttingDownError(f"model {name!r} is still loading")
        if eng is None:
            deadline = time.monotonic() + (timeout or self.settings.request_timeout_s)
            while (eng := self._claim(name)) is None:
                if time.monotonic() >= deadline:
                    raise self._not_ready(name)
                await asyncio.sleep(POLL_S)
        try:
            yield eng
        finally:
            self._let_go(name)

    @contextlib.contextmanager
    def hold(self, model: str | None, timeout: float | None = None) -> Iterator[AsyncEngine]:
        """:meth:`lease` for a thread (blocks while it waits)."""
        name = self.pick(model)
        deadline = time.monotonic() + (timeout or self.settings.request_timeout_s)
        while (eng := self._claim(name)) is None:
            if time.monotonic() >= deadline:
                raise self._not_ready(name)
            time.sleep(POLL_S)
        try:
            yield eng
        finally:
            self._let_go(name)

    def _claim(self, name: str) -> AsyncEngine | None:
        """A lease on ``name``'s engine if it is loaded, else None (ask again).

        A model not loaded starts loading if there is room (the least recently used idle
        ones unloaded for it).
        """
        with self._lock:
            if name in self.errors:
                raise ModelLoadError(f"model {name!r} failed to load: {self.errors[name]}")
            if self._closed:
                raise ShuttingDownError("the server is shutting down")
            eng = self.engines.get(name)
            if eng is not None:
                self._users[name] += 1
                self.engines.move_to_end(name)
                return eng
            if name in self._loading or not self._started:
                return None
            idle = self._idle()
            leaving: list[str] = []
            if self.max_loaded is not None:
                over = len(self.engines) + len(self._loading) + 1 - self.max_loaded
                if len(idle) < over:
                    return None  # every loaded model is held: wait for one to be let go
                leaving = idle[: max(over, 0)]
            need = self.sizes.get(name)
            if self.max_bytes is not None and need is not None:
                rest = [n for n in idle if n not in leaving]
                while self._resident(leaving) + need > self.max_bytes:
                    if not rest:
                        if len(leaving) < len(self.engines) or self._loading:
                            return None  # the room is held: wait for a model to be let go
                        break  # (nothing else loaded: it fits alone, or its load says why)
                    leaving.append(rest.pop(0))
            victims = [(n, self.engines.pop(n)) for n in leaving]
            self._loading.add(name)
        threading.Thread(
            target=self._load, args=(name, victims), name=f"geoserve-load-{name}", daemon=True
        ).start()
        return None

    def _let_go(self, name: str) -> None:
        with self._lock:
            self._users[name] -= 1
            extra = self._trim() if self._over and not self._closed else []
        if extra:  # (not on the caller's thread, which may be the event loop)
            threading.Thread(
                target=self._unload_all, args=(extra,), name="geoserve-unload", daemon=True
            ).start()

    def _unload_all(self, models: list[tuple[str, AsyncEngine]]) -> None:
        for name, eng in models:
            self._unload(name, eng)

    def _not_ready(self, name: str) -> ShuttingDownError | QueueFullError:
        """Why a lease on ``name`` came to its deadline without the engine."""
        with self._lock:
            if name in self._loading or not self._started:
                return ShuttingDownError(f"model {name!r} is still loading")
            busy = ", ".join(self.engines)
        budget = f"--max-loaded-models {self.max_loaded}" if self.max_loaded else ""
        budget += f", --max-loaded-mb {self.settings.max_loaded_mb:g}" if self.max_bytes else ""
        return QueueFullError(
            f"model {name!r} is not loaded and every loaded model ({busy}) has work in flight "
            f"({budget.lstrip(', ')}); try again soon"
        )

    # -- what the routes ask -------------------------------------------------------------------

    def pick(self, model: str | None) -> str:
        """The served model a request names (``None``: the one model, if only one is served).

        A request that names none in its body may name it in the ``serve_multiplexed_model_id``
        header (the body's wins).

        Raises:
            InputError: several models are served and ``model`` is ``None`` (400, listing them).
            UnknownModelError: ``model`` is not served here (404, listing those that are).
        """
        if model is None:
            model = HEADER_MODEL.get()
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

    def describe(self, name: str) -> dict[str, Any]:
        """``name``'s ``GET /v1/models`` entry, as described when it last loaded.

        Its id alone if it never has; ``loaded``: now; ``ready``: a request for it can run;
        ``state``: ``loaded``, ``loading``, ``unloaded`` (loads on first use) or ``failed``.
        """
        with self._lock:
            entry = dict(self._entries.get(name) or model_entry(name, None))
            if name in self.errors:
                state = "failed"
            elif name in self.engines:
                state = "loaded"
            elif name in self._loading or not self._started:
                state = "loading"
            else:
                state = "unloaded"
            entry["loaded"] = state == "loaded"
            entry["ready"] = state in ("loaded", "unloaded")
            entry["state"] = state
        return entry

    @property
    def all_loaded_at_start(self) -> bool:
        """Whether every start-up load is done (a failed one included)."""
        return self._started

    def crashed(self) -> tuple[str, BaseException] | None:
        """A model whose engine loop stopped, and why (never expected)."""
        with self._lock:
            loaded = list(self.engines.items())
        for name, eng in loaded:
            if eng.crashed is not None:
                return name, eng.crashed
        return None

    def progress(self, request_id: str) -> tuple[int, int] | None:
        """(patches done, patches in all) of an admitted request, whichever model runs it."""
        with self._lock:
            loaded = list(self.engines.values())
        for eng in loaded:
            counted = eng.progress(request_id)
            if counted is not None:
                return counted
        return None

    def close(self) -> None:
        """Stop every engine (a load still running stops its engine once built)."""
        with self._lock:
            self._closed = True
            loaded = list(self.engines.values())
            self.engines.clear()
        for eng in loaded:
            eng.close()


def _empty_device_cache() -> None:
    """Hand an unloaded model's device memory back to the device (CUDA's caching allocator)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()
