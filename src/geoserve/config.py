"""Every engine option, declared once: :class:`EngineConfig`.

The fields below are the only place an engine knob is named, typed, defaulted, validated and
described. Everything else is derived from them: :class:`~geoserve.Engine` reads one,
``geoserve predict`` and ``geoserve serve`` generate a flag per field (``--name-with-hyphens``,
``--no-…`` for booleans, choices from ``Literal`` types, help from the docstring; see
:mod:`geoserve.cli.options`), ``--config FILE`` fills one from YAML or JSON, the server's
:class:`~geoserve.server.settings.ServerSettings` holds one and the Ray runners take one.

No torch here: the command line validates its flags without importing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from geoserve.errors import ConfigError
from geoserve.models.hub import check_weights_value
from geoserve.raster.codecs import DEFAULT_COMPRESSION, Codec, Compression, check_level
from geoserve.raster.grid import BlendMode
from geoserve.raster.sinks import DEFAULT_POLYGON_FORMAT, PolygonFormat
from geoserve.raster.trust import DEFAULT_INPUT_FORMATS, check_formats
from geoserve.schemas import OutputKind

#: Most patches one request may have by default (about 100,000 x 100,000 pixels at stride 224).
DEFAULT_MAX_PATCHES = 200_000

DType = Literal["float32", "fp32", "bfloat16", "bf16", "float16", "fp16"]
Preprocess = Literal["auto", "host", "device"]
Backend = Literal["torch", "openvino"]
Precision = Literal["fp32", "bf16", "int8"]


class EngineConfig(BaseModel):
    """How an :class:`~geoserve.Engine` runs its model: one field per option.

    Build one in Python (``EngineConfig(max_batch_patches=32)``), from a file
    (:meth:`from_file`) or from the command line's flags. :meth:`build`, :meth:`from_file`
    and :class:`~geoserve.Engine` raise :class:`~geoserve.errors.ConfigError` naming the
    field; the constructor itself raises pydantic's ``ValidationError`` (a ``ValueError``).
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    weights: Path | str | None = None
    """Weights loaded into the model (strict): a local file, or hf://ORG/REPO[/FILE][@REVISION]
    from the Hugging Face Hub (default: the model's own)."""
    device: str = "cpu"
    """Torch device for the forward passes (cpu, cuda, cuda:1)."""
    dtype: DType | None = None
    """Autocast dtype on the device (bf16 or fp16; default float32)."""
    quantize: Literal["int8"] | None = None
    """CPU only: run the model's linear layers in int8 (dynamic quantisation; check the
    accuracy on your scene first: geoserve bench-accuracy)."""
    backend: Backend = "torch"
    """What runs the model: torch, or openvino (CPU only: the loaded model converted once per
    patch size and cached on disk; docs/performance.md)."""
    precision: Precision | None = None
    """openvino backend: fp32 (the default), bf16 (CPUs with native bf16: AMX or AVX512-BF16)
    or int8 (post-training static quantisation calibrated on --calibrate scenes; CPUs with
    VNNI/AMX)."""
    calibrate: list[Path] | None = None
    """openvino: scenes whose patches (a few dozen, through the model's input processor)
    calibrate int8 and check int8, bf16 (required) or fp32 against torch fp32 (the torch
    backend does not use them)."""
    accuracy_gate: Literal["refuse", "warn"] = "refuse"
    """openvino int8/bf16: under 99 % same classes as torch fp32 on the calibration patches,
    refuse to start (or only warn)."""
    force_precision: bool = False
    """openvino: use bf16 or int8 even where the CPU lacks what makes them pay (bf16: AMX or
    AVX512-BF16; int8: AVX512-VNNI, AVX-VNNI or AMX)."""
    backend_cache_dir: Path | None = None
    """Where converted models are kept (default: $XDG_CACHE_HOME/geoserve/converted, else
    ~/.cache/geoserve/converted)."""
    threads: Annotated[int, Field(ge=1)] | None = None
    """Torch CPU threads for the model (default: torch's, one per core; 1 can be faster for
    tiny models, see performance.md)."""
    patch_size: Annotated[int, Field(ge=1)] | None = None
    """Patch size in pixels (default: the model's)."""
    stride: Annotated[int, Field(ge=1)] | None = None
    """Step between patches in pixels (default: the model's)."""
    blend: BlendMode | None = None
    """How overlapping patches combine (default: the model's)."""
    bands: list[int | str] | None = None
    """Input bands the model reads: 0-based indices or band descriptions (default: the model's)."""
    output_kind: list[OutputKind] | None = None
    """What the model's output becomes: classes, probabilities, confidence, raw, polygons,
    embeddings or patch-embeddings; several (classes,confidence) from one model pass (default:
    the model's own)."""
    min_area: Annotated[float, Field(ge=0)] = 0.0
    """Polygons output: drop polygons of fewer pixels than this."""
    max_polygon_vertices_per_pixel: Annotated[float, Field(ge=0)] | None = 1.0
    """Polygons output: most vertices its polygons may have together, per class-map pixel
    (always at least 50,000); tracing stops and the request fails past it (a Sentinel-2 class
    map has about 0.05, a checkerboard 5; 0 or null: no limit)."""
    polygon_format: PolygonFormat = DEFAULT_POLYGON_FORMAT
    """Polygons output: the vector format of files the engine names (-o DIR/, several kinds,
    the server's path outputs) and of bytes and base64 answers: gpkg (GeoPackage 1.2, which
    GDAL and QGIS 3 open), geojson, or parquet (GeoParquet, which GDAL reads only from 3.8
    built with Arrow); a file name's own vector suffix wins."""
    embedding_layer: int = -1
    """Embeddings outputs: the encoder block whose tokens are written (0-based; -1: the last)."""
    embedding_dtype: Literal["float32", "float16"] = "float32"
    """Embeddings output: the GeoTIFF's data type."""
    steps: Annotated[int, Field(ge=1, le=1000)] | None = None
    """Generative models: denoising steps of each diffusion-decoded output (TerraMind:
    TerraTorch's trailing spacing, so 50 runs 50 UNet calls and 3 runs 4; default: the
    model's, 50 for TerraMind)."""
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """Generative models: token sampling temperature (0: the most likely token, no
    randomness; default: the model's, 1.0 for TerraMind)."""
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    """Generative models: sample among the most likely tokens whose probability passes top_p
    (0: all; default: the model's, 0.8 for TerraMind)."""
    top_k: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    """Generative models: sample among the top_k most likely tokens (0, or more than the
    vocabulary: all; default: the model's, 0 for TerraMind)."""
    batch_invariant: bool | None = None
    """Generative models: run each patch's network calls alone within its batch, so its output
    never depends on the batch it shared, bit for bit (default: on; off: whole-batch calls,
    faster on a GPU, equal across batch sizes only to float rounding)."""
    max_batch_patches: Annotated[int, Field(ge=1)] | Literal["auto"] = 16
    """Most patches per forward pass, from all pending requests ('auto': from free GPU memory)."""
    compile: bool = False
    """torch.compile the model; batches are padded to one shape (worth it on a GPU)."""
    compile_backend: str = "inductor"
    """torch.compile backend used with compile (inductor, eager, ...)."""
    share_weights: bool = True
    """Hold a part of the model whose weights equal one already loaded in this process (a
    fine-tune's frozen encoder beside another fine-tune of it) once, shared: matched by
    content hash at load time (not with quantize)."""
    warmup: bool = True
    """Run one dummy patch at start-up to check the model against its processors."""
    prefetch: bool = True
    """Read each request's next patch rows on the reader threads while the model runs."""
    read_workers: Annotated[int, Field(ge=1)] | None = None
    """Reader threads shared by all requests, also GDAL's decoding threads (default: cores, ≤ 4)."""
    prefetch_rows: Annotated[int, Field(ge=0)] = 2
    """Grid rows each request keeps read ahead (and reads at once, up to read_workers)."""
    preprocess: Preprocess = "auto"
    """Where patches are cast, normalised, cut and stitched: host, device or auto (CUDA: device)."""
    cross_request_batching: bool = True
    """Fill batches with patches of several requests (off: one request's per batch)."""
    streaming: bool = True
    """Write each band of finished output rows at once (off: hold a request's whole output)."""
    cog: bool = False
    """Write outputs as Cloud-Optimized GeoTIFFs (tiles and overviews)."""
    output_compression: Compression = DEFAULT_COMPRESSION
    """How GeoTIFF outputs are compressed, all losslessly: zstd (GDAL 2.3+ built with libzstd,
    as Debian's and QGIS 3.22's; a class map several times faster to write than deflate),
    deflate (what any TIFF reader opens; geoserve's codec before), lzw, packbits or none."""
    output_compression_level: Annotated[int, Field(ge=1, le=22)] | None = None
    """The codec's level: zstd 1-22, deflate 1-12 (default: zstd 1; deflate 6 for class
    maps, 1 for floats)."""
    output_dir: Path | None = None
    """Directory for outputs written to disk without an explicit path."""
    allowed_formats: list[str] = Field(default_factory=lambda: list(DEFAULT_INPUT_FORMATS))
    """GDAL formats inputs may be in (GTiff covers COG); any other content is refused unread."""
    max_patches: Annotated[int, Field(ge=0)] | None = DEFAULT_MAX_PATCHES
    """Most patches one request may have (0 or null: no limit)."""
    max_request_mb: Annotated[float, Field(gt=0)] | None = None
    """Most memory one request's estimate may take, in MB (default: 75 % of physical memory)."""

    @model_validator(mode="before")
    @classmethod
    def _accept_objects(cls, data: Any) -> Any:
        """Also take what Python callers hand over: torch dtypes and devices."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("dtype", "device"):
            value = data.get(key)
            if type(value).__module__ == "torch":  # torch.bfloat16, torch.device("cuda")
                data[key] = str(value).removeprefix("torch.")
        return data

    @model_validator(mode="after")
    def _level_of_the_codec(self) -> EngineConfig:
        """A level the chosen codec takes (lzw, packbits and none take none)."""
        try:
            check_level(self.output_compression, self.output_compression_level)
        except ValueError as exc:
            raise ValueError(f"output_compression_level: {exc}") from None
        return self

    @property
    def codec(self) -> Codec:
        """The outputs' :class:`~geoserve.raster.codecs.Codec`."""
        return Codec(self.output_compression, self.output_compression_level)

    @model_validator(mode="after")
    def _quantize_on_cpu(self) -> EngineConfig:
        """int8 runs on the CPU, in float32 around the int8 layers."""
        if self.quantize is None:
            return self
        if not self.device.startswith("cpu"):
            raise ValueError(
                f"quantize: {self.quantize} is a CPU path (PyTorch's int8 kernels run on the "
                f"CPU); on {self.device} use dtype bf16 instead"
            )
        if self.dtype not in (None, "float32", "fp32"):
            raise ValueError(
                f"quantize: {self.quantize} runs the other layers in float32; it does not "
                f"combine with dtype {self.dtype}"
            )
        return self

    @model_validator(mode="after")
    def _backend_options(self) -> EngineConfig:
        """The openvino backend: on the CPU, alone; int8 and bf16 need scenes to check on."""
        if self.backend == "torch":
            if self.precision not in (None, "fp32"):
                raise ValueError(
                    f"precision: {self.precision} is an openvino precision (--backend openvino); "
                    "with torch use --quantize int8 or --dtype bf16"
                )
            return self
        if not self.device.startswith("cpu"):
            raise ValueError(f"backend: {self.backend} runs on the CPU, not on {self.device}")
        clash = [
            f"{k} {v}"
            for k, v in (("quantize", self.quantize), ("dtype", self.dtype))
            if v not in (None, "float32", "fp32")
        ] + (["compile"] if self.compile else [])
        if clash:
            raise ValueError(
                f"backend: {self.backend} does not combine with {', '.join(clash)} (torch "
                "options); choose its precision with --precision"
            )
        if self.precision in ("int8", "bf16") and not self.calibrate:
            what = "calibrated and checked" if self.precision == "int8" else "checked"
            raise ValueError(
                f"precision: {self.precision} is {what} on your own scenes, never on random "
                "data: give --calibrate SCENE.tif (a few dozen patches of it are used)"
            )
        return self

    @field_validator("weights", mode="before")
    @classmethod
    def _file_or_hub_reference(cls, value: Any) -> Any:
        """Text is a path, or a checked ``hf://`` reference kept as text (fetched later)."""
        return check_weights_value(value) if isinstance(value, str) else value

    @field_validator("output_kind", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> Any:
        """One kind, a comma-separated text, or a list; each kind once."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("the list is empty")
            repeated = sorted({str(v) for v in value if list(value).count(v) > 1})
            if repeated:
                raise ValueError(f"{', '.join(repeated)} asked for more than once")
            return list(value)
        return value

    @field_validator("allowed_formats")
    @classmethod
    def _known_formats(cls, value: list[str]) -> list[str]:
        return list(check_formats(value))

    @field_validator("max_patches", "max_polygon_vertices_per_pixel")
    @classmethod
    def _zero_is_no_limit(cls, value: float | None) -> float | None:
        return value or None

    @field_validator("bands")
    @classmethod
    def _some_bands(cls, value: list[int | str] | None) -> list[int | str] | None:
        if value is not None and not value:
            raise ValueError("the list is empty")
        return value

    # -- building one ------------------------------------------------------------------------

    @classmethod
    def build(
        cls, base: EngineConfig | Mapping[str, Any] | None = None, **overrides: Any
    ) -> EngineConfig:
        """``base`` with ``overrides`` applied, validated.

        ``base`` is an :class:`EngineConfig`, a mapping of field names, or None (the defaults).

        Raises:
            ConfigError: naming the field at fault.
        """
        if isinstance(base, EngineConfig):
            values = base.model_dump(exclude_unset=True)
        elif isinstance(base, Mapping):
            values = dict(base)
        elif base is None:
            values = {}
        else:
            raise ConfigError(f"config: expected an EngineConfig, got {type(base).__name__}")
        values.update(overrides)
        return cls.checked(values)

    @classmethod
    def checked(cls, values: dict[str, Any], *, source: str = "") -> EngineConfig:
        """Validate ``values``; errors are :class:`ConfigError` naming the field (and file)."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise config_error(exc, source, cls.model_fields) from None

    @classmethod
    def from_file(cls, path: str | Path) -> EngineConfig:
        """Read a YAML or JSON file whose keys are field names (see docs/configuration.md)."""
        return cls.checked(read_config_file(path), source=str(path))


def config_error(
    exc: ValidationError, source: str, fields: Any, label: Callable[[str], str] = str
) -> ConfigError:
    """One clause per invalid field, ``<file>: <field>: <why> (got <value>)``.

    ``label`` names a field as its reader knows it (``--max-batch-patches`` for flags). The
    alternatives of a union field are said together; an unknown key lists the known ones.
    """
    whys: dict[str, list[str]] = {}
    got: dict[str, Any] = {}
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else "config"
        why = str(err["msg"]).removeprefix("Value error, ").removeprefix("Input should be ")
        field, _, rest = why.partition(": ")
        if not err["loc"] and field in fields:  # a check across fields names its field first
            name, why = field, rest
        elif err["type"] == "extra_forbidden":
            why = f"unknown option; known: {', '.join(fields)}"
        elif err["type"] != "missing":
            got[name] = err.get("input")
        whys.setdefault(name, [])
        if why not in whys[name]:
            whys[name].append(why)
    where = f"{source}: " if source else ""
    clauses = []
    for name, reasons in whys.items():
        said = " or ".join(reasons)
        if said.startswith(("greater", "less", "a valid", "a finite", "'")):
            said = f"should be {said}"
        tail = f" (got {got[name]!r})" if name in got else ""
        clauses.append(f"{where}{label(name)}: {said}{tail}")
    return ConfigError("; ".join(clauses))


#: Largest configuration file read (a configuration is a few hundred bytes).
MAX_CONFIG_BYTES = 64 << 10


#: The generation options one request may set for itself (``steps`` and ``batch_invariant``
#: fix how the engine runs the model, so they are the engine's alone).
REQUEST_GENERATION_OPTIONS = ("temperature", "top_p", "top_k")


def check_request_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A request's generation options, validated as the engine's fields of the same names.

    Raises:
        ConfigError: an option a request cannot set, or a value out of its field's range,
            naming it.
    """
    unknown = sorted(set(options) - set(REQUEST_GENERATION_OPTIONS))
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)}: not a per-request option; a request may set "
            f"{', '.join(REQUEST_GENERATION_OPTIONS)}"
        )
    for name, value in options.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name}: should be a number, got {value!r:.40}")
    try:
        cfg = EngineConfig.model_validate(dict(options))
    except ValidationError as exc:
        raise config_error(exc, "", EngineConfig.model_fields) from None
    return {k: getattr(cfg, k) for k in options}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A configuration file's mapping: JSON for ``.json``, else YAML (a superset of JSON).

    YAML is read as plain data: no tags that build objects, and no aliases (``*name``), which
    can multiply a small file into a huge document.

    Raises:
        ConfigError: the file cannot be read or parsed, or does not hold a mapping.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        text = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read the configuration file: {exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES >> 10} KB; not a configuration")
    kind = "JSON" if p.suffix.lower() == ".json" else "YAML"
    try:
        data = json.loads(text, object_pairs_hook=_unique) if kind == "JSON" else _load_yaml(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError, a duplicate key
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"{p}: not valid {kind}: {why}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"{p}: expected a mapping of option names to values at the top level")
    return data


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (a repeated option is a mistake)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is given twice")
        out[key] = value
    return out


def _load_yaml(text: str) -> Any:
    import yaml

    class PlainLoader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML ships no types)
        """SafeLoader without aliases and without repeated keys."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"aliases (*name) are not allowed ({mark})")
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            repeated = sorted({k for k in keys if keys.count(k) > 1})
            if repeated:
                raise yaml.YAMLError(
                    f"{', '.join(map(repr, repeated))} given twice ({node.start_mark})"
                )
            return super().construct_mapping(node, deep)

    return yaml.load(text, Loader=PlainLoader)  # noqa: S506 (a SafeLoader)
