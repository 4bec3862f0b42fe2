"""Online serving with replicas: the geoserve HTTP app as a Ray Serve deployment.

Each replica runs the same FastAPI app as ``geoserve serve`` (so the same routes, guards and
error codes) with its own engine and its own cross-request patch batching; Ray Serve's proxy
spreads requests over the replicas.

With several models, every replica serves all of them, each loaded on its first request there
(and, with ``max_loaded_models``, the least recently used idle one unloaded), and the models
are multiplexed over the replicas as Ray Serve does it: a request that names its model in the
``serve_multiplexed_model_id`` header (as :class:`geoserve.Client` sends it) is routed to a
replica that has that model loaded, or to one with the fewest models when none has; each
replica tells Ray which models it holds (:func:`_multiplexed`). A request that names its model
only in its body is still answered, by whichever replica it reaches.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from geoserve.errors import PluginLoadError
from geoserve.job_wire import MODEL_HEADER
from geoserve.server.settings import ServerSettings


def build_app(
    settings: ServerSettings,
    *,
    replicas: int = 2,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
    imports: Sequence[str] = (),
) -> Any:
    """The bound Ray Serve application (pass it to ``serve.run``).

    Raises:
        PluginLoadError: Ray Serve is not installed (``pip install 'geoserve[ray]'``).
    """
    try:
        from ray import serve
    except ImportError as exc:
        raise PluginLoadError(
            f"Ray Serve is not installed: pip install 'geoserve[ray]' ({exc})"
        ) from exc
    from geoserve.server.app import create_app

    for module in imports:
        importlib.import_module(module)
    app = create_app(settings)
    if len(settings.model_names) > 1:
        _multiplexed(app, settings)

    @serve.deployment(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=max(16, settings.max_queued_patches),
    )
    @serve.ingress(app)
    class GeoServeReplica:
        """One engine behind the geoserve routes."""

        def __init__(self) -> None:
            for module in imports:
                importlib.import_module(module)

    return GeoServeReplica.bind()  # type: ignore[attr-defined]


def serve_on_ray(
    settings: ServerSettings,
    *,
    address: str | None = None,
    replicas: int = 2,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
    blocking: bool = True,
) -> None:
    """Start Ray Serve on ``settings.host:settings.port`` and deploy the replicas.

    Raises:
        ConfigError: the settings name Hub weights without ``allow_hub_weights`` (before Ray
            starts; each replica fetches them into its own machine's cache).
    """
    settings.check_weights_source()
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(
        build_app(
            settings,
            replicas=replicas,
            cpus_per_replica=cpus_per_replica,
            gpus_per_replica=gpus_per_replica,
        ),
        name="geoserve",
        route_prefix="/",
        blocking=blocking,
    )


def _multiplexed(app: Any, settings: ServerSettings) -> None:
    """Tell Ray Serve which models this replica holds, so it routes requests by model.

    Ray Serve routes a request with a ``serve_multiplexed_model_id`` header to a replica whose
    ``@serve.multiplexed`` loader has that id in its cache. Here the loader only records the
    name (the app's own lease loads and unloads the engine, under the same
    ``max_loaded_models``, least recently used first): it is called for every request that
    names a served model in the header, as it arrives, so the requests that follow it while
    the model loads come here too. (A routing hint only: what runs, and whether it may, is
    the app's to decide.)
    """
    from ray import serve

    per_replica = settings.max_loaded_models or len(settings.model_names)

    @serve.multiplexed(max_num_models_per_replica=per_replica)  # type: ignore[untyped-decorator]
    async def held(model_id: str) -> str:
        return model_id

    app.add_middleware(_RecordModel, held=held, names=frozenset(settings.model_names))


class _RecordModel:
    """ASGI middleware: a request's ``serve_multiplexed_model_id`` given to ``held`` first.

    Every answer says which replica gave it (``X-Geoserve-Replica``: Ray's replica id).
    """

    def __init__(
        self, app: Any, held: Callable[[str], Awaitable[str]], names: frozenset[str]
    ) -> None:
        self.app, self.held, self.names = app, held, names
        self.replica: bytes | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = MODEL_HEADER.encode()
        named = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == header]
        if named and named[0] in self.names:
            await self.held(named[0])
        if self.replica is None:
            from ray import serve

            self.replica = str(serve.get_replica_context().replica_id.unique_id).encode()
        replica = self.replica

        async def send_marked(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-geoserve-replica", replica)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_marked)
