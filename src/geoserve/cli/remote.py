"""``geoserve predict --server URL``: the same requests as a local run, as jobs of a server.

The arguments mean what they mean locally: each input (or with ``--time-series`` all of them,
or the ``-i`` modalities) is one request; ``--output-kind``, ``--bands``, ``--dates`` and
``--seed`` go with it; ``-o`` / ``--output-dir`` and ``--stac-item`` name the same files.
Local files are uploaded with their job, URLs sent for the server to fetch. The progress bar
is the local one, over the patches the server reports; each job's outputs are downloaded
(whole, then renamed into place) to exactly the files a local run writes, a class map's
``.aux.xml`` sidecar included. ``--stac-item`` writes the server's Item of the job, its asset
hrefs and inputs made the local run's (files beside the Item, inputs as given on the command
line).

The model is the server's (``--model``, if given, must name one it serves; a server of
several models needs it), and so are its engine options: the flags that only set up a local
engine (``--device``, ``--dtype``, ``--batch-size``, ``--compile``, ...; ``--ray``,
``--quicklook``, ``--config-file``) are refused with ``--server``, on the command line and in a
``--config`` file alike. Ctrl-C dismisses the jobs not yet finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from geoserve.cli.options import engine_config, flag, given
from geoserve.cli.predict import settle_output_and_dates, unreadable_inputs
from geoserve.config import REQUEST_GENERATION_OPTIONS, EngineConfig
from geoserve.errors import (
    ConfigError,
    GeoServeError,
    JobFailedError,
    OutputWriteError,
    ServerAuthError,
    ServerError,
    ServerUnreachableError,
)

#: The engine options a job takes (the rest set up the server's engine, not a request).
REQUEST_OPTIONS = ("bands", "output_kind", "output_dir", *REQUEST_GENERATION_OPTIONS)
#: How often the jobs' statuses are polled.
POLL_S = 0.5


def predict_remote(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    request: dict[str, Any] | None,
    from_file: dict[str, Any],
) -> int:
    """Run ``predict``'s requests on ``args.server``; 1 if any failed."""
    _refuse_local_options(args, from_file)
    config = engine_config(args, from_file)
    settle_output_and_dates(args, parser, config, request)
    wanted = getattr(args, "model", None) or from_file.get("model")
    key = args.api_key or os.environ.get("GEOSERVE_API_KEY") or None
    from geoserve.client import Client

    with Client(args.server, key) as client:
        models = client.models()
        ids = [m["id"] for m in models]
        if wanted and wanted not in ids:
            listed = ", ".join(map(repr, ids))
            raise ConfigError(f"--model {wanted}: the server at {client.url} serves {listed}")
        if not wanted and len(ids) > 1:
            raise ConfigError(
                f"the server at {client.url} serves {len(ids)} models ({', '.join(ids)}); "
                "choose one with --model NAME"
            )
        entry = models[ids.index(wanted)] if wanted else models[0]
        served = entry["id"]
        if not entry.get("ready"):
            raise ServerError(f"{client.url}: model {served!r} is still loading; try again soon")
        output = entry.get("output")
        offered = output.get("kinds") if isinstance(output, dict) else None
        kinds = list(config.output_kind or (offered if isinstance(offered, list) else []))
        if not kinds or not all(isinstance(k, str) for k in kinds):
            raise ServerError(f"{client.url}/v1/models: the model's output kinds are not given")
        return _RemoteRun(client, args, config, request, kinds, served).run()


def _refuse_local_options(args: argparse.Namespace, from_file: dict[str, Any]) -> None:
    """Refuse what only sets up a local engine or run (naming the flags or keys)."""
    flags = [flag(k) for k in given(args, EngineConfig) if k not in REQUEST_OPTIONS]
    keys = [k for k in from_file if k in EngineConfig.model_fields and k not in REQUEST_OPTIONS]
    local = {
        "--ray": args.ray,
        "--quicklook": args.quicklook is not None,
        "--config-file": bool(args.config_file),
        "--register": bool(args.register),
        "--models-dir": bool(args.models_dir),
    }
    flags += [name for name, set_ in local.items() if set_]
    if flags:
        raise ConfigError(
            f"{', '.join(flags)}: not with --server (the server runs the model with its own "
            "engine options; a job takes --output-kind, --bands, --dates, --seed, --temperature, "
            "--top-p and --top-k)"
        )
    if keys:
        raise ConfigError(
            f"{args.config}: {', '.join(keys)}: engine options, not with --server (a job "
            "takes model, output_kind, bands, output_dir, temperature, top_p and top_k)"
        )


class _RemoteRun:
    """The requests of one ``predict --server``: submitted, followed, downloaded."""

    def __init__(
        self,
        client: Any,
        args: argparse.Namespace,
        config: EngineConfig,
        request: dict[str, Any] | None,
        kinds: list[str],
        model: str,
    ) -> None:
        self.client, self.args, self.config, self.kinds = client, args, config, kinds
        self.model = model
        self.items: list[Any] = [list(args.inputs)] if args.time_series else list(args.inputs)
        if request is not None:
            self.items = [request]
        one = args.time_series or request is not None
        self.dates = [args.dates] if one else args.dates or [None] * len(self.items)
        self.request = request
        self.failed = 0

    def run(self) -> int:
        from geoserve.cli.multimodal import sources_of
        from geoserve.cli.stac_items import item_targets

        args, items = self.args, self.items
        labelled = sources_of(self.request) if self.request else [(None, n) for n in args.inputs]
        bad = unreadable_inputs(labelled, self.config.allowed_formats)
        if bad and (self.request is not None or args.time_series or len(bad) == len(items)):
            if len(items) > 1 and not args.quiet:
                print(f"0 of {len(items)} inputs done, {len(items)} failed")
            return 1
        self.failed = len(bad)
        paths = self._paths(self.config.polygon_format)
        self.stac = item_targets(args.stac_item, items, paths)
        t0 = time.perf_counter()
        jobs: dict[str, int] = {}  # job id -> index of its request
        try:
            for i, (item, when) in enumerate(zip(items, self.dates, strict=False)):
                if isinstance(item, str) and item in bad:
                    continue
                job_id = self._submit(item, when)
                if job_id is not None:
                    jobs[job_id] = i
            patches = self._follow(jobs)
        except KeyboardInterrupt:
            self._dismiss(jobs)
            raise
        if not args.quiet and len(items) > 1:
            dt = time.perf_counter() - t0
            print(
                f"{len(items) - self.failed} of {len(items)} inputs done, {self.failed} failed, "
                f"{patches} patches in {dt:.1f} s ({patches / max(dt, 1e-9):.1f} patches/s)"
            )
        return 1 if self.failed else 0

    def _paths(self, polygon_format: str) -> list[Path]:
        """Each request's output path, by the local rule (raster names checked too)."""
        from geoserve.raster.sinks import check_geotiff_name, planned_paths, product_paths

        out = Path(self.args.output)
        if len(self.items) > 1 and out.exists() and not out.is_dir():
            raise ConfigError(f"-o {out}: exists and is not a directory (several inputs need one)")
        try:
            paths = planned_paths(
                self.items, out, self.kinds, polygon_format, single=len(self.items) == 1
            )
        except ConfigError as exc:
            raise ConfigError(f"-o {exc}") from None
        for path in paths:
            files = product_paths(path, self.kinds, polygon_format=polygon_format)
            for kind, file in zip(self.kinds, files, strict=True):
                if kind not in ("polygons", "patch-embeddings"):
                    check_geotiff_name(file, kind)
                if not file.parent.is_dir():  # (as a local run refuses it)
                    raise OutputWriteError(f"{file}: output directory {file.parent} does not exist")
        return paths

    def _submit(self, item: Any, when: Any) -> str | None:
        """One request as a job; its id (``None``: refused, reported)."""
        try:
            return str(
                self.client.submit(
                    item,
                    model=self.model,
                    output_kind=self.config.output_kind,
                    bands=self.config.bands,
                    dates=when,
                    seed=self.args.seed,
                    temperature=self.config.temperature,
                    top_p=self.config.top_p,
                    top_k=self.config.top_k,
                )
            )
        except (ServerUnreachableError, ServerAuthError):
            raise  # (no other request would fare better)
        except GeoServeError as exc:
            print(f"geoserve: error: {exc}", file=sys.stderr)
            self.failed += 1
            return None

    def _follow(self, jobs: dict[str, int]) -> int:
        """Poll the jobs until all have ended, each downloaded when it succeeds; patches."""
        from geoserve.job_wire import JobsBar, job_outcome

        bar = None if self.args.quiet else JobsBar(sys.stderr)
        last: dict[str, Any] = {}
        pending = dict(jobs)
        patches = 0
        while pending:
            ended = []
            for job_id in list(pending):
                last[job_id] = st = self.client.status(job_id)
                if st.done:
                    ended.append((job_id, pending.pop(job_id)))
            if bar is not None:
                bar.show(list(last.values()))
            for job_id, i in ended:
                st = last[job_id]
                counted = st.patches[1] if st.patches else 0
                try:
                    job_outcome(st)
                    self._download(job_id, i, counted, st.seconds)
                    patches += counted
                except (ServerUnreachableError, ServerAuthError):
                    raise
                except (JobFailedError, ServerError, ConfigError) as exc:
                    print(f"geoserve: error: {exc}", file=sys.stderr)
                    self.failed += 1
            if pending:
                time.sleep(POLL_S)
        return patches

    def _dismiss(self, jobs: dict[str, int]) -> None:
        """Ctrl-C: the jobs not finished are dismissed (best effort)."""
        for job_id in jobs:
            try:
                if not self.client.status(job_id).done:
                    self.client.dismiss(job_id)
            except GeoServeError:
                continue

    def _download(self, job_id: str, i: int, patches: int, seconds: float | None) -> None:
        """A successful job's outputs to the files a local run writes; report each."""
        from geoserve.raster.sinks import FORMAT_SUFFIX, product_paths

        doc = self.client.results_document(job_id)
        if set(doc.outputs) != set(self.kinds):
            raise ServerError(
                f"job {job_id}: the server made {', '.join(doc.outputs) or 'nothing'}, "
                f"not {', '.join(self.kinds)}"
            )
        fmt: str = self.config.polygon_format
        if "polygons" in doc.outputs:
            suffix = Path(doc.outputs["polygons"].name).suffix.lower()
            fmts = [f for f, s in FORMAT_SUFFIX.items() if s == suffix]
            if not fmts:
                raise ServerError(f"job {job_id}: polygons as {suffix!r}, a format not known here")
            fmt = fmts[0]
        path = self._paths(fmt)[i]
        files = product_paths(path, self.kinds, polygon_format=fmt)
        names = dict(zip(self.kinds, files, strict=True))
        for kind, file in names.items():
            server = Path(doc.outputs[kind].name).suffix.lower()
            if kind == "polygons" and file.suffix.lower() != server:
                raise ConfigError(
                    f"{file}: the server writes polygons as {server} files; name the output so"
                )
        item = None
        if str(path) in self.stac:
            item = self.client.stac_item(job_id)
            if item is None:
                raise ServerError(f"job {job_id}: the server gives no STAC Item (--stac-item)")
        self.client.results(job_id, names=names)
        took = "" if seconds is None else f", {seconds:.2f} s"
        if not self.args.quiet:
            for kind, file in names.items():
                print(f"wrote {file} ({_described(kind, file)}, {patches} patches{took})")
        if item is not None:
            self._write_item(item, self.stac[str(path)], names, self.items[i])

    def _write_item(
        self, item: dict[str, Any], target: Path, names: dict[str, Path], given: Any
    ) -> None:
        """Write the server's Item of a request as the local run's.

        Its hrefs are the local files (relative to it), its inputs the ones given here; it is
        written under a temporary name and renamed into place.
        """
        from geoserve.cli.stac_items import given_inputs
        from geoserve.raster import tempfiles

        assets = item["assets"]
        for kind, file in names.items():
            if not isinstance(assets.get(kind), dict):
                raise ServerError(f"{target}: the server's STAC Item has no {kind!r} asset")
            assets[kind]["href"] = Path(os.path.relpath(file, target.parent)).as_posix()
        item["id"] = target.stem
        properties = item.get("properties")
        if isinstance(properties, dict):
            properties["geoserve:inputs"] = given_inputs(given)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfiles.new_temporary(target)
        try:
            tmp.write_text(json.dumps(item, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, target)
            tempfiles.release(tmp, remove=False)
        except OSError as exc:
            tempfiles.release(tmp, remove=True)
            raise ConfigError(f"{target}: {exc.strerror or exc}") from None
        if not self.args.quiet:
            print(f"wrote {target} (STAC Item)")


def _described(kind: str, file: Path) -> str:
    """What a downloaded output is, as a local run says it (size, bands and type)."""
    if kind in ("polygons", "patch-embeddings"):
        return f"{kind}, {file.suffix.lstrip('.')}"
    import rasterio

    with rasterio.open(file) as dst:
        return f"{dst.width}x{dst.height}, {dst.count} band(s) {dst.dtypes[0]}"
