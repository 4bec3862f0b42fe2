"""Server settings: every knob of ``geoserve serve``, validated, with its default and reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from geoserve.raster.trust import check_formats


class ServerSettings(BaseModel):
    """Settings of the HTTP server (CLI flags map one to one; see docs/serving.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    """Registered model name to serve."""
    weights: Path | None = None
    """Local weights file for the model."""
    host: str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing is exposed by accident."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port (0 picks a free one)."""
    device: str = "cpu"
    """Torch device for the model."""
    dtype: str | None = None
    """Autocast dtype (bf16, fp16)."""
    max_batch_patches: Annotated[int, Field(ge=1)] | Literal["auto"] = 16
    """Most patches per forward pass, drawn from all pending requests ('auto': sized from
    free device memory on a GPU)."""
    compile: bool = False
    """torch.compile the model (slower start-up, faster forward passes on a GPU)."""
    read_workers: int | None = Field(None, ge=1)
    """Reader threads shared by all requests (default: cores, at most 4)."""
    prefetch_rows: int = Field(2, ge=0)
    """Grid rows each request keeps read ahead of the model."""
    preprocess: Literal["auto", "host", "device"] = "auto"
    """Where patches are cast, normalised and cut: 'device' on CUDA by default."""
    cog: bool = False
    """Write outputs as Cloud-Optimized GeoTIFFs."""
    max_wait_ms: float = Field(0.0, ge=0)
    """How long a batch may wait to fill, from the oldest pending request (0: never wait)."""
    cross_request_batching: bool = True
    """Fill batches from several requests; off only to measure what batching buys."""
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
    allowed_url_domains: list[str] = Field(default_factory=list)
    """Host names that ``url`` inputs may fetch from; empty: URL inputs are refused."""
    url_reads: Literal["range", "download"] = "range"
    """'range': read URL inputs in place by HTTP range requests (GDAL /vsicurl/) when the host
    supports them; 'download': always fetch the whole file first."""
    allowed_formats: list[str] = Field(default_factory=lambda: ["GTiff"])
    """GDAL formats inputs may be in (GTiff covers COG); any other content gets 400 unread."""
    output_dir: Path | None = None
    """Where ``path`` outputs are written; unset: path outputs are refused."""
    api_key: str | None = Field(default_factory=lambda: os.environ.get("GEOSERVE_API_KEY"))
    """Key every route but /health/* requires (Bearer or X-API-Key); env GEOSERVE_API_KEY."""
    shutdown_timeout_s: float = Field(30.0, ge=0)
    """On SIGTERM, how long in-flight requests may take to finish while new ones get 503."""
    retry_after_s: int = Field(1, ge=0)
    """Retry-After value sent with 503 responses."""

    @field_validator("allowed_formats")
    @classmethod
    def _known_formats(cls, value: list[str]) -> list[str]:
        return list(check_formats(value))
