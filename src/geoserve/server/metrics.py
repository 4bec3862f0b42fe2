"""Prometheus metrics (``geoserve_`` prefix), one registry per app so several can coexist.

A server of several models gives the series that are per model a ``model`` label (the
forward passes, patches, batch sizes and fill, queue depth, requests in flight, stage times,
request latency, non-finite pixels, step series and the tile cache); a one-model server's
series have no such label, as they always had. Requests answered and errors stay per server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from geoserve.engine.patch_cache import PatchCache
from geoserve.engine.stepping import StepStats
from geoserve.schemas import ImageRequestOutput, StageTimings

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The server's metrics; see docs/serving.md for what each means."""

    def __init__(
        self, max_batch_patches: int | Mapping[str, int], models: Sequence[str] = ()
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        #: Whether the per-model series carry a ``model`` label (several models served).
        self.by_model = len(models) > 1
        self._first = models[0] if models else ""
        per = ["model"] if self.by_model else []
        if isinstance(max_batch_patches, Mapping):
            self._max_batch = dict(max_batch_patches)
            max_batch_patches = max(self._max_batch.values())
        else:
            self._max_batch = dict.fromkeys(models, max_batch_patches)
        self.requests = Counter(
            "geoserve_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "geoserve_errors", "Failed requests by error kind", ["kind"], registry=r
        )
        self.patches = Counter("geoserve_patches", "Patches through the model", per, registry=r)
        self.batches = Counter("geoserve_batches", "Forward passes", per, registry=r)
        buckets = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch_patches})
        self.batch_size = Histogram(
            "geoserve_batch_size_patches",
            "Patches per forward pass",
            labelnames=per,
            buckets=[b for b in buckets if b <= max_batch_patches],
            registry=r,
        )
        self.batch_fill = Histogram(
            "geoserve_batch_fill_ratio",
            "Batch size / max_batch_patches",
            labelnames=per,
            buckets=(0.125, 0.25, 0.5, 0.75, 1.0),
            registry=r,
        )
        self.queue_depth = Gauge(
            "geoserve_queue_depth_patches",
            "Patches of admitted requests still to go through the model",
            per,
            registry=r,
        )
        self.in_flight = Gauge(
            "geoserve_requests_in_flight", "Requests admitted, not finished", per, registry=r
        )
        self.stage = Histogram(
            "geoserve_stage_seconds",
            "Per-request time in each stage",
            ["stage", *per],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "geoserve_request_duration_seconds",
            "Request latency, admission to response",
            ["endpoint", *per],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # (a gauge that only goes up: the series name has no ``_total``, as it always had)
        self.nonfinite = Gauge(
            "geoserve_nonfinite_output_pixels",
            "Class-map pixels the model returned NaN or inf for (written as nodata)",
            per,
            registry=r,
        )
        self.loaded = Gauge(
            "geoserve_model_loaded",
            "1 while the model is loaded, 0 when not",
            ["model"],
            registry=r,
        )
        for name in models:
            self.loaded.labels(model=name).set(0)
        self.loads = Counter(
            "geoserve_model_loads", "Times the model was loaded", ["model"], registry=r
        )
        self.unloads = Counter(
            "geoserve_model_unloads",
            "Times the model was unloaded to make room",
            ["model"],
            registry=r,
        )
        self.load_seconds = Histogram(
            "geoserve_model_load_seconds",
            "Time to load the model (build, weights, warm-up)",
            ["model"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.steps = StepStatsCollector(self.by_model)
        r.register(self.steps)
        self._default_batch = max_batch_patches

    def of(self, metric: Any, model: str | None, **labels: str) -> Any:
        """``metric``'s series for ``model`` (and ``labels``): labelled only by_model."""
        if self.by_model:  # (none named: the first model's, which scenes and the page run)
            labels["model"] = model or self._first
        return metric.labels(**labels) if labels else metric

    def bind(
        self,
        queue_depth: Callable[[], float],
        in_flight: Callable[[], float],
        steps: StepStats | None = None,
        model: str | None = None,
    ) -> None:
        """Read the gauges (and a stepped model's ``steps``) from its engine when scraped."""
        self.of(self.queue_depth, model).set_function(queue_depth)
        self.of(self.in_flight, model).set_function(in_flight)
        self.steps.stats[model] = steps

    def model_loaded(self, model: str, seconds: float) -> None:
        """Record that ``model`` loaded, in ``seconds``."""
        self.loaded.labels(model=model).set(1)
        self.loads.labels(model=model).inc()
        self.load_seconds.labels(model=model).observe(seconds)

    def model_unloaded(self, model: str) -> None:
        """Record that ``model`` was unloaded to make room."""
        self.loaded.labels(model=model).set(0)
        self.unloads.labels(model=model).inc()

    def observe_batch(self, size: int, model: str | None = None) -> None:
        """Record one forward pass of ``model`` (called from its engine thread)."""
        self.of(self.batches, model).inc()
        self.of(self.patches, model).inc(size)
        self.of(self.batch_size, model).observe(size)
        cap = self._max_batch.get(model or "", self._default_batch)
        self.of(self.batch_fill, model).observe(size / cap)

    def observe_latency(self, endpoint: str, seconds: float, model: str | None = None) -> None:
        """Record a request's latency, admission to response."""
        self.of(self.latency, model, endpoint=endpoint).observe(seconds)

    def observe_stages(self, timings: StageTimings, model: str | None = None) -> None:
        """Record a finished request's stage times."""
        for stage in StageTimings.STAGES:
            self.of(self.stage, model, stage=stage).observe(getattr(timings, stage))

    def observe_outputs(self, result: ImageRequestOutput, model: str | None = None) -> None:
        """Count what a finished request's outputs hold: its class maps' non-finite pixels."""
        self.of(self.nonfinite, model).inc(result.nonfinite_pixels)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class PatchCacheCollector:
    """The patch caches' hits, misses and size for ``/metrics`` (read when scraped).

    ``caches``: one :class:`PatchCache` (a one-model server: no labels), or one per model
    (a ``model`` label each).
    """

    def __init__(self, caches: PatchCache | Mapping[str, PatchCache]) -> None:
        self.caches = caches

    def collect(self) -> Iterator[Any]:
        """The three series, as they stand now."""
        if isinstance(self.caches, PatchCache):
            c = self.caches
            yield CounterMetricFamily(
                "geoserve_tile_cache_hits", "Tile patches found in the patch cache", c.hits
            )
            yield CounterMetricFamily(
                "geoserve_tile_cache_misses", "Tile patches that ran the model", c.misses
            )
            yield GaugeMetricFamily(
                "geoserve_tile_cache_bytes", "Bytes held by the patch cache", c.bytes
            )
            return
        hits = CounterMetricFamily(
            "geoserve_tile_cache_hits", "Tile patches found in the patch cache", labels=["model"]
        )
        misses = CounterMetricFamily(
            "geoserve_tile_cache_misses", "Tile patches that ran the model", labels=["model"]
        )
        held = GaugeMetricFamily(
            "geoserve_tile_cache_bytes", "Bytes held by the patch cache", labels=["model"]
        )
        for model, c in self.caches.items():
            hits.add_metric([model], c.hits)
            misses.add_metric([model], c.misses)
            held.add_metric([model], c.bytes)
        yield from (hits, misses, held)


class StepStatsCollector:
    """A stepped model's :class:`StepStats` for ``/metrics``, by step kind (read when scraped).

    ``stats``: by model (``None``: a one-model server's); no series at all for one-pass
    models (``None`` stats). ``by_model``: a ``model`` label beside ``kind``.
    """

    def __init__(self, by_model: bool = False) -> None:
        self.stats: dict[str | None, StepStats | None] = {}
        self.by_model = by_model

    def collect(self) -> Iterator[Any]:
        """The four series, one sample per step kind of each stepped model's plan."""
        stepped = {m: s for m, s in self.stats.items() if s is not None}
        if not stepped:
            return
        labels = ["kind", "model"] if self.by_model else ["kind"]
        batches = CounterMetricFamily(
            "geoserve_step_batches", "Step batches run, by step kind", labels=labels
        )
        steps = CounterMetricFamily(
            "geoserve_patch_steps", "Patch-steps run (step batch sizes, summed)", labels=labels
        )
        seconds = CounterMetricFamily(
            "geoserve_step_seconds", "Seconds the step batches took", labels=labels
        )
        fill = GaugeMetricFamily(
            "geoserve_step_batch_fill_ratio",
            "Mean step batch size / max_batch_patches since start",
            labels=labels,
        )
        for model, stats in stepped.items():
            for kind, k in stats.snapshot().items():
                values = [kind, model or ""] if self.by_model else [kind]
                batches.add_metric(values, k.batches)
                steps.add_metric(values, k.patch_steps)
                seconds.add_metric(values, k.seconds)
                fill.add_metric(values, k.mean_fill)
        yield from (batches, steps, seconds, fill)
