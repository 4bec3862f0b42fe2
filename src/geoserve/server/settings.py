"""Server settings: the server's own knobs, and the engine's :class:`EngineConfig` beside them.

:class:`ServerFields` declares what only the server has (address, limits, guards); the command
line generates ``serve``'s flags from it as it does the engine's from
:class:`~geoserve.config.EngineConfig`. :class:`ServerSettings` is both, plus the model name,
or the models (:class:`ServedModel`: a name and its own ``EngineConfig``) when it serves several.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from geoserve.config import EngineConfig
from geoserve.errors import ConfigError
from geoserve.models.hub import hub_endpoint, is_hub_reference


class ServerFields(BaseModel):
    """What only the HTTP server has (one flag each; see docs/serving.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing is exposed by accident."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port (0 picks a free one)."""
    max_wait_ms: float = Field(0.0, ge=0)
    """How long a batch may wait to fill, from the oldest pending request (0: never wait)."""
    max_queued_patches: int = Field(4096, ge=1)
    """Admission bound in patches; beyond it requests get 503 with Retry-After."""
    request_timeout_s: float = Field(120.0, gt=0)
    """A request still unfinished after this long is dropped with 504."""
    max_body_mb: float = Field(200.0, gt=0)
    """Largest request body, counted as it streams in; larger gets 413."""
    max_pixels: int = Field(400_000_000, ge=1)
    """Largest decoded request (width x height x bands x dates); larger gets 413."""
    max_memory_mb: float = Field(1024.0, gt=0)
    """Estimated memory all admitted requests may hold together while they stream (a request
    costs its padded row, not its pixel count; see docs/serving.md); over it alone: 413;
    over it with the admitted ones: 503."""
    allowed_input_dirs: list[Path] = Field(default_factory=list)
    """Directories that ``path`` inputs may name; empty: path inputs are refused."""
    models_dir: Path | None = None
    """Directory of TerraTorch fine-tunes registered at start-up, one NAME/config.yaml and one
    checkpoint beside it per model (see docs/models.md); serve one with --model NAME."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names the server answers to (the Host header, a guard against DNS rebinding),
    besides localhost, 127.0.0.1, ::1 and the --host address (bound to 0.0.0.0 or ::: also
    any IP address and this machine's own name); '*': any. Others get 400."""
    allowed_url_domains: list[str] = Field(default_factory=list)
    """Host names that ``url`` inputs may fetch from; empty: URL inputs are refused."""
    url_reads: Literal["range", "download"] = "range"
    """'range': read URL inputs in place by HTTP range requests (GDAL /vsicurl/) when the host
    supports them; 'download': always fetch the whole file first."""
    admission_threads: int | None = Field(None, ge=1)
    """Threads that open requests' inputs (headers only), in each of two lanes: requests that
    reach other hosts (URLs, STAC Items), one thread each, and the rest (uploads, local files),
    which never wait behind a slow host; unset: cores + 4, at most 32."""
    max_remote_requests: int = Field(256, ge=1)
    """Most HTTP requests one request's inputs may make to the allowed hosts before its pixels
    are read (the server's checks of each URL and file of a STAC Item, downloads, GDAL
    opening each; a GDAL open counts as 2); more gets 413."""
    max_remote_mb: float | None = Field(None, gt=0)
    """Most megabytes one request's inputs may fetch from the allowed hosts before its pixels
    are read (downloads, header checks; a GDAL open counts as 16 KB); unset: --max-body-mb;
    more gets 413."""
    api_key: str | None = Field(default_factory=lambda: os.environ.get("GEOSERVE_API_KEY"))
    """Key every route but /health/* requires (Bearer, X-API-Key, or as the password of HTTP
    Basic, which the map page's browser asks for); env GEOSERVE_API_KEY."""
    shutdown_timeout_s: float = Field(30.0, ge=0)
    """On SIGTERM, how long in-flight requests may take to finish while new ones get 503."""
    retry_after_s: int = Field(1, ge=0)
    """Retry-After value sent with 503 responses."""
    ui: bool = False
    """Serve the map page at / (upload a scene, see prediction tiles over it)."""
    basemap_url: str | None = None
    """XYZ URL template (http or https, with {z}, {x} and {y}) of a basemap under the map page;
    none by default: the page then fetches nothing from elsewhere."""
    tile_cache_mb: float = Field(512.0, ge=0)
    """Memory for predicted patches kept for map tiles (least recently used dropped first)."""
    max_scenes: int = Field(16, ge=1)
    """Most scenes uploaded for map tiles (POST /v1/scenes) kept at once."""
    max_scenes_mb: float = Field(2048.0, gt=0)
    """Most megabytes of uploaded scenes kept at once (under --output-dir/scenes)."""
    scene_ttl_s: float = Field(3600.0, gt=0)
    """An uploaded scene is removed this long after its last use."""
    job_store: str | None = None
    """Where asynchronous jobs are kept (POST /v1/jobs, /ogcapi): a SQLite file path or
    sqlite:///PATH, or postgresql://...; unset: --output-dir/jobs.sqlite3. Jobs need
    --output-dir (their outputs go under --output-dir/jobs/<job id>/)."""
    job_ttl_s: float = Field(86400.0, gt=0)
    """A finished job and its outputs are removed this long after it finished."""
    max_jobs: int = Field(1000, ge=1)
    """Most jobs queued and running at once; beyond it submissions get 503 with Retry-After."""
    job_lease_s: float = Field(30.0, ge=3)
    """A running job whose server has not reported on it for this long (servers report every
    half second) is taken to be abandoned, its server stopped: any server on the same job store
    queues it again. Servers sharing a store need the same --output-dir."""
    job_workers: int = Field(1, ge=1)
    """Jobs run at once (each at a lower priority than interactive requests)."""
    max_inline_mb: float = Field(8.0, gt=0)
    """Largest job input given inline (base64, decoded size); larger gets 413. Also the
    largest output a job's results give inline when asked (Prefer: return=representation, or
    an OGC output by value); a larger one stays a download link."""
    max_loaded_models: int | None = Field(None, ge=1)
    """Most of the served models loaded at once: a model loads on its first request (one
    that arrives while it loads waits for it), and to make room the least recently used model
    with no request, job or tile in flight is unloaded; unset: every model stays loaded."""
    max_loaded_mb: float | None = Field(None, gt=0)
    """Most megabytes of weights (parameters and buffers, host or device, a tensor shared
    between models counted once) of the served models loaded at once: a model's size is
    measured when it first loads; to make room the least recently used models with nothing in
    flight are unloaded (before a load whose size is known, else right after it); a model
    larger than this alone fails to load. Unset: no limit in megabytes."""
    preload: bool | None = None
    """Load models at start-up, in the order served (at most --max-loaded-models of them);
    unset: yes, unless --max-loaded-models or --max-loaded-mb is set (then each loads on its
    first request)."""
    device_turns: bool | None = None
    """Several models: run one model's batch at a time on the device, the next turn to the
    model with the least device time for its share; unset: on when the models run on an
    accelerator (cuda), off on the CPU (there each engine's torch threads run side by side)."""
    allow_hub_weights: bool = False
    """Let --weights be a Hub reference (hf://...), fetched from huggingface.co (or HF_ENDPOINT)
    at start-up; off: the server refuses to start with one."""

    @field_validator("basemap_url")
    @classmethod
    def _xyz_template(cls, value: str | None) -> str | None:
        """An http(s) XYZ template: the page's browser fetches it, nothing else does."""
        if value is None:
            return value
        if not value.startswith(("https://", "http://")) or not all(
            f"{{{k}}}" in value for k in "zxy"
        ):
            raise ValueError("an http(s) URL template with {z}, {x} and {y}")
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _no_empty_key(cls, value: Any) -> Any:
        """An empty key would switch authentication off without a word: refuse it."""
        if value is None:
            return os.environ.get("GEOSERVE_API_KEY")
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty; leave it out (and GEOSERVE_API_KEY unset) to require none")
        return value


#: Engine options that are the server's, not a model's: one value for every served model.
SERVER_WIDE_ENGINE_OPTIONS = ("output_dir", "allowed_formats")


class ServedModel(BaseModel):
    """One model a server serves: its registered name and the engine options it runs with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    """Registered model name."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """Its engine's options: the server's ``engine`` with this model's own over them."""
    share: float = Field(1.0, gt=0)
    """Its share of the device beside the other served models: models with work waiting get
    device time in proportion to their shares (:class:`~geoserve.engine.turns.Turns`)."""


def served_model(entry: Any, base: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``models`` entry as :class:`ServedModel`'s fields.

    ``entry``: a name, or a mapping of ``name``, an optional ``share`` and engine options
    (each an :class:`~geoserve.config.EngineConfig` field) that override ``base`` (the
    server's engine options as given) for this model. The server-wide options
    (:data:`SERVER_WIDE_ENGINE_OPTIONS`) are refused in an entry.

    Raises:
        ConfigError: no name, an unknown or server-wide option, or an invalid value (naming
            ``where``, the entry and the field).
    """
    if isinstance(entry, ServedModel):
        return {"name": entry.name, "engine": entry.engine, "share": entry.share}
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: a model name, or a mapping of name and engine options")
    options = dict(entry)
    name = options.pop("name", None)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: name: the registered model name is required")
    share = options.pop("share", 1.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
        raise ConfigError(f"{where} ({name}): share: a number > 0 (its share of the device)")
    if set(options) == {"engine"}:  # a ServedModel as model_dump() gives it: whole already
        engine = options["engine"]
        if not isinstance(engine, EngineConfig):
            engine = EngineConfig.checked(dict(engine), source=f"{where} ({name})")
        return {"name": name, "engine": engine, "share": float(share)}
    wide = [k for k in options if k in SERVER_WIDE_ENGINE_OPTIONS]
    if wide:
        raise ConfigError(
            f"{where} ({name}): {', '.join(wide)}: the server's, for every model; set it at "
            "the top level"
        )
    engine = EngineConfig.checked({**base, **options}, source=f"{where} ({name})")
    return {"name": name, "engine": engine, "share": float(share)}


class ServerSettings(ServerFields):
    """Everything ``geoserve serve`` runs with: the model, the engine's options, the server's.

    Engine options may also be given at the top level (``ServerSettings(model="m",
    max_batch_patches=32)``); they are moved into :attr:`engine`. Several models:
    ``ServerSettings(models=["a", {"name": "b", "max_batch_patches": 4}])``, each entry's
    engine options over the top-level ones (:func:`served_model`).
    """

    model: str
    """Registered model name to serve (with ``models``: the first of them, unless given)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """How the engine runs the model; its ``output_dir`` is where ``path`` outputs are
    written (unset: path outputs are refused). With ``models``: every model's base options,
    and the server-wide ones (``output_dir``, ``allowed_formats``)."""
    models: list[ServedModel] = Field(default_factory=list)
    """Every model served, each with its own engine (empty: ``model`` alone, with ``engine``)."""

    @model_validator(mode="before")
    @classmethod
    def _engine_options_at_top_level(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        top = {k: v for k, v in data.items() if k in EngineConfig.model_fields}
        rest = {k: v for k, v in data.items() if k not in top}
        engine = rest.get("engine", {})
        if isinstance(engine, EngineConfig):
            engine = engine.model_dump(exclude_unset=True)
        if top:
            rest["engine"] = engine = {**engine, **top}
        entries = rest.get("models")
        if entries:
            if not isinstance(entries, list):
                raise ConfigError("models: a list of model names or of name and engine options")
            rest["models"] = [
                served_model(e, engine, f"models[{i}]") for i, e in enumerate(entries)
            ]
            if not rest.get("model"):
                rest["model"] = rest["models"][0]["name"]
        return rest

    @model_validator(mode="after")
    def _one_of_the_models(self) -> ServerSettings:
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"models: {', '.join(twice)} listed more than once")
        if names and self.model not in names:
            raise ConfigError(f"model: {self.model!r} is not one of models ({', '.join(names)})")
        return self

    @property
    def served(self) -> list[ServedModel]:
        """Every served model with its engine options, in order (one: ``model``)."""
        return list(self.models) or [ServedModel(name=self.model, engine=self.engine, share=1.0)]

    @property
    def model_names(self) -> list[str]:
        """The served models' names, in order."""
        return [m.name for m in self.served]

    @property
    def preloaded(self) -> list[str]:
        """The models loaded at start-up (``preload``, at most ``max_loaded_models``).

        (With ``max_loaded_mb``, one that does not fit pushes out the earliest, as later loads do.)
        """
        budget = self.max_loaded_models or self.max_loaded_mb
        lazy = self.preload is False or (self.preload is None and budget)
        return [] if lazy else self.model_names[: self.max_loaded_models]

    @property
    def takes_turns(self) -> bool:
        """Whether the served models take turns on the device (``device_turns``)."""
        if len(self.served) < 2:
            return False
        if self.device_turns is not None:
            return self.device_turns
        return any(not m.engine.device.startswith("cpu") for m in self.served)

    def engine_of(self, name: str) -> EngineConfig:
        """The engine options of the served model ``name``."""
        for m in self.served:
            if m.name == name:
                return m.engine
        raise ConfigError(f"model {name!r} is not served here")

    def check_weights_source(self) -> None:
        """Refuse Hub weights unless ``allow_hub_weights`` (the server then reaches the network).

        Raises:
            ConfigError: ``engine.weights`` is an ``hf://`` reference and the flag is off.
        """
        for served in self.served:
            weights = served.engine.weights
            if is_hub_reference(weights) and not self.allow_hub_weights:
                raise ConfigError(
                    f"weights {weights!r} is a Hub reference, which the server would fetch from "
                    f"{hub_endpoint()} at start-up: allow that with --allow-hub-weights "
                    "(allow_hub_weights: true in a --config file), or give a local file"
                )

    @property
    def output_dir(self) -> Path | None:
        """Where ``path`` outputs are written (``engine.output_dir``); None: refused."""
        return self.engine.output_dir
