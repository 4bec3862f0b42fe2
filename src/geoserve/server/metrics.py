"""Prometheus metrics (``geoserve_`` prefix), one registry per app so several can coexist."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from geoserve.engine.patch_cache import PatchCache
from geoserve.engine.stepping import StepStats
from geoserve.schemas import ImageRequestOutput, StageTimings

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The server's metrics; see docs/serving.md for what each means."""

    def __init__(self, max_batch_patches: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "geoserve_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "geoserve_errors", "Failed requests by error kind", ["kind"], registry=r
        )
        self.patches = Counter("geoserve_patches", "Patches through the model", registry=r)
        self.batches = Counter("geoserve_batches", "Forward passes", registry=r)
        buckets = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch_patches})
        self.batch_size = Histogram(
            "geoserve_batch_size_patches",
            "Patches per forward pass",
            buckets=[b for b in buckets if b <= max_batch_patches],
            registry=r,
        )
        self.batch_fill = Histogram(
            "geoserve_batch_fill_ratio",
            "Batch size / max_batch_patches",
            buckets=(0.125, 0.25, 0.5, 0.75, 1.0),
            registry=r,
        )
        self.queue_depth = Gauge(
            "geoserve_queue_depth_patches",
            "Patches of admitted requests still to go through the model",
            registry=r,
        )
        self.in_flight = Gauge(
            "geoserve_requests_in_flight", "Requests admitted, not finished", registry=r
        )
        self.stage = Histogram(
            "geoserve_stage_seconds",
            "Per-request time in each stage",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "geoserve_request_duration_seconds",
            "Request latency, admission to response",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # (a gauge that only goes up: the series name has no ``_total``, as it always had)
        self.nonfinite = Gauge(
            "geoserve_nonfinite_output_pixels",
            "Class-map pixels the model returned NaN or inf for (written as nodata)",
            registry=r,
        )
        self.steps = StepStatsCollector()
        r.register(self.steps)
        self._max_batch = max_batch_patches

    def bind(
        self,
        queue_depth: Callable[[], float],
        in_flight: Callable[[], float],
        steps: StepStats | None = None,
    ) -> None:
        """Read the gauges (and a stepped model's ``steps``) from the engine when scraped."""
        self.queue_depth.set_function(queue_depth)
        self.in_flight.set_function(in_flight)
        self.steps.stats = steps

    def observe_batch(self, size: int) -> None:
        """Record one forward pass (called from the engine thread)."""
        self.batches.inc()
        self.patches.inc(size)
        self.batch_size.observe(size)
        self.batch_fill.observe(size / self._max_batch)

    def observe_stages(self, timings: StageTimings) -> None:
        """Record a finished request's stage times."""
        for stage in StageTimings.STAGES:
            self.stage.labels(stage=stage).observe(getattr(timings, stage))

    def observe_outputs(self, result: ImageRequestOutput) -> None:
        """Count what a finished request's outputs hold: its class maps' non-finite pixels."""
        self.nonfinite.inc(result.nonfinite_pixels)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class PatchCacheCollector:
    """A :class:`PatchCache`'s hits, misses and size for ``/metrics`` (read when scraped)."""

    def __init__(self, cache: PatchCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Any]:
        """The three series, as they stand now."""
        yield CounterMetricFamily(
            "geoserve_tile_cache_hits", "Tile patches found in the patch cache", self.cache.hits
        )
        yield CounterMetricFamily(
            "geoserve_tile_cache_misses", "Tile patches that ran the model", self.cache.misses
        )
        yield GaugeMetricFamily(
            "geoserve_tile_cache_bytes", "Bytes held by the patch cache", self.cache.bytes
        )


class StepStatsCollector:
    """A stepped model's :class:`StepStats` for ``/metrics``, by step kind (read when scraped).

    No series at all for a one-pass model (``stats`` None).
    """

    def __init__(self) -> None:
        self.stats: StepStats | None = None

    def collect(self) -> Iterator[Any]:
        """The four series, one sample per step kind of the model's plan."""
        if self.stats is None:
            return
        kinds = self.stats.snapshot()
        batches = CounterMetricFamily(
            "geoserve_step_batches", "Step batches run, by step kind", labels=["kind"]
        )
        steps = CounterMetricFamily(
            "geoserve_patch_steps", "Patch-steps run (step batch sizes, summed)", labels=["kind"]
        )
        seconds = CounterMetricFamily(
            "geoserve_step_seconds", "Seconds the step batches took", labels=["kind"]
        )
        fill = GaugeMetricFamily(
            "geoserve_step_batch_fill_ratio",
            "Mean step batch size / max_batch_patches since start",
            labels=["kind"],
        )
        for kind, k in kinds.items():
            batches.add_metric([kind], k.batches)
            steps.add_metric([kind], k.patch_steps)
            seconds.add_metric([kind], k.seconds)
            fill.add_metric([kind], k.mean_fill)
        yield from (batches, steps, seconds, fill)
