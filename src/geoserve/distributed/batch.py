"""Many scenes on a Ray cluster: Ray Data over file paths, one engine per actor.

Only paths travel through Ray's object store, never decoded rasters: each actor opens its
scenes itself, runs them through its own :class:`~geoserve.Engine` (so patches of the scenes in
one call share batches), and writes the outputs itself. A scene that fails is retried in the
actor, then reported with its reason; it is never dropped silently. Outputs are written
atomically, so an existing output file is a complete one, and a re-run skips those scenes.
"""

from __future__ import annotations

import glob
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geoserve.config import EngineConfig
from geoserve.errors import ConfigError, GeoServeError, PluginLoadError
from geoserve.raster.sinks import output_paths, product_paths
from geoserve.seeds import SEED_RANGE, is_seed


@dataclass(frozen=True)
class SceneResult:
    """What happened to one scene."""

    path: str
    output: str
    ok: bool
    error: str = ""
    patches: int = 0
    seconds: float = 0.0
    attempts: int = 0
    skipped: bool = False


@dataclass
class BatchSummary:
    """All scenes of a batch run and its totals."""

    results: list[SceneResult] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def failed(self) -> list[SceneResult]:
        """Scenes that failed after their retries."""
        return [r for r in self.results if not r.ok]

    @property
    def patches(self) -> int:
        """Patches through the model in this run."""
        return sum(r.patches for r in self.results)

    def line(self) -> str:
        """One-line summary."""
        done = sum(1 for r in self.results if r.ok and not r.skipped)
        skipped = sum(1 for r in self.results if r.skipped)
        rate = self.patches / self.wall_seconds if self.wall_seconds > 0 else 0.0
        return (
            f"{done} scene(s) done, {skipped} skipped (output exists), {len(self.failed)} "
            f"failed; {self.patches} patches in {self.wall_seconds:.1f} s ({rate:.1f} patches/s)"
        )


def expand_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Paths and glob patterns -> a sorted, de-duplicated list of paths.

    Raises:
        ConfigError: a pattern that matches nothing (a typo should not look like success).
    """
    out: list[str] = []
    for item in inputs:
        text = os.fspath(item)
        if any(ch in text for ch in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise ConfigError(f"{text}: the pattern matches no file")
            out.extend(matches)
        else:
            out.append(text)
    return list(dict.fromkeys(out))


class SceneRunner:
    """The Ray Data actor: one engine, scenes in, results out (paths only)."""

    def __init__(
        self,
        model: str,
        config: EngineConfig,
        retries: int,
        imports: Sequence[str],
        seed: int = 0,
    ) -> None:
        from geoserve.engine import Engine

        for module in imports:
            importlib.import_module(module)
        self.engine = Engine(model, config)
        self.retries = retries
        self.seed = seed

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """Run a batch of scenes (all in one engine, so they share batches); one row each."""
        from geoserve.engine.request_spec import RequestSpec

        outputs = {str(p): str(o) for p, o in zip(batch["path"], batch["output"], strict=True)}
        attempts = dict.fromkeys(outputs, 0)
        errors: dict[str, str] = {}
        done: dict[str, SceneResult] = {}
        pending = dict(outputs)
        while pending:
            t0 = time.perf_counter()
            for path, out in pending.items():
                attempts[path] += 1
                spec = RequestSpec(path, request_id=path, output_path=out, seed=self.seed)
                self.engine.add_request(spec)
            for result in self.engine.run_until_done():
                path = result.request_id
                if result.error is None:
                    seconds = time.perf_counter() - t0
                    done[path] = SceneResult(
                        path, outputs[path], True, "", result.num_patches, seconds, attempts[path]
                    )
                else:
                    errors[path] = str(result.error)
            pending = {
                p: o for p, o in pending.items() if p not in done and attempts[p] <= self.retries
            }
        for path, out in outputs.items():
            if path not in done:
                done[path] = SceneResult(
                    path, out, False, errors.get(path, "unknown"), attempts=attempts[path]
                )
        rows = [done[p] for p in outputs]
        return {name: [getattr(r, name) for r in rows] for name in SceneResult.__dataclass_fields__}


def _root_cause(exc: BaseException) -> str:
    """The innermost error message of a (Ray-wrapped) exception, one line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in reversed(lines):
        if "Error:" in line and not line.startswith("ray."):
            return line.split("Error: ", 1)[-1]
    return lines[-1] if lines else type(exc).__name__


def run_batch(
    inputs: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    /,
    *,
    model: str,
    address: str | None = None,
    actors: int = 2,
    cpus_per_actor: float = 1.0,
    gpus_per_actor: float = 0.0,
    scenes_per_call: int = 2,
    retries: int = 1,
    imports: Sequence[str] = (),
    on_result: Callable[[SceneResult], None] | None = None,
    config: EngineConfig | None = None,
    seed: int = 0,
    **overrides: Any,
) -> BatchSummary:
    """Run scenes (paths or glob patterns) on Ray; outputs go to the directory ``out_dir``.

    Connects to ``address`` ("auto" for a running cluster), or starts a local one when it is
    ``None``. ``actors`` engines run at once, each with ``cpus_per_actor`` CPUs and
    ``gpus_per_actor`` GPUs; each call hands an actor ``scenes_per_call`` scenes. ``imports``
    are modules each actor imports first (models registered in code rather than through an
    installed plugin). Each actor's engine runs with ``config`` (an
    :class:`~geoserve.config.EngineConfig`), with ``overrides`` (its field names: weights,
    patch_size, device, ...) applied. ``seed``: every scene's request's (a generative model's
    random draws; each patch's derive from it and the patch's place on its scene). The model,
    the configuration and the seed are checked here first, so a wrong name or value fails at
    once.

    Raises:
        PluginLoadError: Ray is not installed (``pip install 'geoserve[ray]'``).
        ConfigError: a glob pattern matches nothing, or a seed that is not one.
    """
    try:
        import ray
    except ImportError as exc:
        raise PluginLoadError(f"Ray is not installed: pip install 'geoserve[ray]' ({exc})") from exc
    from geoserve.engine import resolve_model

    if not is_seed(seed):
        raise ConfigError(f"seed: {SEED_RANGE}, got {seed!r:.40}")
    for module in imports:
        importlib.import_module(module)
    default_kind = resolve_model(model)[2].kind
    config = EngineConfig.build(config, **overrides)
    kinds = config.output_kind or [default_kind]
    t0 = time.perf_counter()
    paths = expand_inputs(inputs)
    fmt = config.polygon_format
    outputs = [str(p) for p in output_paths(paths, out_dir, kinds, fmt)]  # stems for several kinds
    summary = BatchSummary()
    todo = []
    for path, out in zip(paths, outputs, strict=True):
        if all(p.is_file() for p in product_paths(Path(out), kinds, polygon_format=fmt)):
            summary.results.append(SceneResult(path, out, True, skipped=True))
        else:
            todo.append({"path": path, "output": out})
    if todo:
        if not ray.is_initialized():
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                ignore_reinit_error=True,
            )
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # geoserve reports per scene instead
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        ds = ray.data.from_items(todo, override_num_blocks=max(1, len(todo)))
        results = ds.map_batches(
            SceneRunner,
            fn_constructor_kwargs={
                "model": model,
                "config": config,
                "retries": retries,
                "imports": list(imports),
                "seed": seed,
            },
            batch_size=scenes_per_call,
            compute=ray.data.ActorPoolStrategy(size=max(1, min(actors, len(todo)))),
            num_cpus=cpus_per_actor,
            num_gpus=gpus_per_actor,
        )
        try:
            for row in results.iter_rows():
                result = SceneResult(**{k: row[k] for k in SceneResult.__dataclass_fields__})
                summary.results.append(result)
                if on_result is not None:
                    on_result(result)
        except Exception as exc:  # e.g. an actor that cannot build its engine
            reason = _root_cause(exc)
            raise GeoServeError(f"running on Ray failed: {reason}") from exc
    order = {p: i for i, p in enumerate(paths)}
    summary.results.sort(key=lambda r: order[r.path])
    summary.wall_seconds = time.perf_counter() - t0
    return summary
