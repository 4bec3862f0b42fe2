"""Online serving with replicas: the geoserve HTTP app as a Ray Serve deployment.

Each replica runs the same FastAPI app as ``geoserve serve`` (so the same routes, guards and
error codes) with its own engine and its own cross-request patch batching; Ray Serve's proxy
spreads requests over the replicas.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from geoserve.errors import PluginLoadError
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
