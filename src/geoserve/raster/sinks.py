"""Output sinks: where a request's finished output rows go, in the form the request asked for.

The engine hands each band of finished rows to the request's :class:`OutputSink` as soon as the
rows are final (see :mod:`geoserve.engine.canvas`), so a scene never has to fit in memory.
``path`` streams into a tiled GeoTIFF under a temporary name, renamed into place only when the
last row is in; ``b64`` and ``bytes`` stream into an in-memory GeoTIFF; ``tensor`` fills one
array; ``xarray`` fills one array and commits it as a DataArray
(:mod:`geoserve.raster.xarray_sink`). :meth:`OutputSink.abort` (a failed or cancelled
request) leaves nothing behind. A sink's ``cancelled`` is its request's cancel flag: a long
commit (tracing polygons) checks it.
"""

from __future__ import annotations

import base64
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from geoserve.errors import ConfigError
from geoserve.raster.codecs import DEFAULT_CODEC, Codec
from geoserve.raster.write import OutputRaster, RowWriter
from geoserve.schemas import ImageOutput, OutFormat


class OutputSink(ABC):
    """Receives one request's output rows top to bottom, then commits or aborts."""

    def __init__(self, height: int, width: int) -> None:
        self.height, self.width = height, width
        self.meta: OutputRaster | None = None
        #: Set when the sink's request was aborted (the request hands its own flag over).
        self.cancelled: threading.Event | None = None

    @property
    def target(self) -> Path | None:
        """The file this sink renames into place on commit (None: none)."""
        return None

    def write(self, row: int, out: OutputRaster) -> None:
        """Take output rows starting at image row ``row``."""
        if self.meta is None:
            self.meta = out
        self._write(row, out)

    @abstractmethod
    def _write(self, row: int, out: OutputRaster) -> None: ...

    @abstractmethod
    def commit(self, out_format: OutFormat) -> ImageOutput:
        """Finish the output once every row is in.

        Raises:
            OutputWriteError: the output cannot be finished.
        """

    def abort(self) -> None:  # noqa: B027 - nothing to release by default
        """Drop what was written (failed or cancelled request)."""

    def _described(self, out_format: OutFormat) -> ImageOutput:
        assert self.meta is not None
        count, dtype = self.meta.data.shape[0], str(self.meta.data.dtype)
        return ImageOutput(out_format, self.width, self.height, count, dtype)


class GeoTiffSink(OutputSink):
    """Streams rows into a GeoTIFF file (``path``) or in-memory GeoTIFF (``b64``/``bytes``)."""

    def __init__(
        self,
        path: Path | None,
        profile: Mapping[str, Any],
        height: int,
        width: int,
        *,
        cog: bool = False,
        codec: Codec = DEFAULT_CODEC,
    ) -> None:
        super().__init__(height, width)
        self.writer = RowWriter(path, profile, height, width, cog=cog, codec=codec)

    @property
    def target(self) -> Path | None:
        """The GeoTIFF's path (None for bytes)."""
        return self.writer.path

    def _write(self, row: int, out: OutputRaster) -> None:
        self.writer.write(row, out)

    def commit(self, out_format: OutFormat) -> ImageOutput:
        """Rename the file into place, or encode the bytes."""
        result = self.writer.commit()
        out = self._described(out_format)
        if isinstance(result, Path):
            out.path = result
        elif out_format == "b64":
            out.b64 = base64.b64encode(result).decode("ascii")
        else:
            out.data = result
        return out

    def abort(self) -> None:
        """Remove the temporary file."""
        self.writer.abort()


class ArraySink(OutputSink):
    """Collects rows into one (bands, H, W) array: tensor outputs must be whole in memory."""

    def __init__(self, height: int, width: int) -> None:
        super().__init__(height, width)
        self.array: NDArray[Any] | None = None

    def _write(self, row: int, out: OutputRaster) -> None:
        if self.array is None:
            self.array = np.empty((out.data.shape[0], self.height, self.width), out.data.dtype)
        self.array[:, row : row + out.data.shape[1]] = out.data

    def commit(self, out_format: OutFormat) -> ImageOutput:
        """The array as a tensor."""
        import torch  # (only here: the raster package does not import torch)

        assert self.array is not None
        out = self._described(out_format)
        out.tensor = torch.from_numpy(self.array)
        return out

    def abort(self) -> None:
        """Drop the array."""
        self.array = None


def make_sink(
    out_format: OutFormat,
    path: Path | None,
    profile: Mapping[str, Any],
    height: int,
    width: int,
    *,
    cog: bool = False,
    codec: Codec = DEFAULT_CODEC,
) -> OutputSink:
    """The sink for ``out_format`` (``path`` is used only for ``"path"``).

    ``codec``: how a GeoTIFF is compressed.

    Raises:
        OutputWriteError: the output directory does not exist.
        ConfigError: ``xarray`` without the ``xarray`` extra installed.
    """
    if out_format == "tensor":
        return ArraySink(height, width)
    if out_format == "xarray":
        from geoserve.raster.xarray_sink import XarraySink  # (it builds on this module)

        return XarraySink(profile, height, width)
    path = path if out_format == "path" else None
    return GeoTiffSink(path, profile, height, width, cog=cog, codec=codec)


#: The vector formats polygons may be written in (EngineConfig's ``polygon_format``).
PolygonFormat = Literal["gpkg", "geojson", "parquet"]
#: The polygons' default format: GeoPackage, which every GDAL since 2.0 and every QGIS 3 opens
#: (GeoParquet needs GDAL 3.8 built with Arrow: not Debian 12's GDAL 3.6 or QGIS 3.22).
DEFAULT_POLYGON_FORMAT: PolygonFormat = "gpkg"
#: The file suffix an engine-chosen name gets for each polygon format.
FORMAT_SUFFIX: dict[str, str] = {"gpkg": ".gpkg", "geojson": ".geojson", "parquet": ".parquet"}
#: The file suffix of each output kind written as a vector file; every other kind is a GeoTIFF.
KIND_SUFFIX = {"polygons": ".gpkg", "patch-embeddings": ".parquet"}
#: The formats polygons may be written in, by file suffix (docs/outputs.md).
POLYGON_FORMATS: dict[str, str] = {
    ".parquet": "parquet",
    ".geoparquet": "parquet",
    ".geojson": "geojson",
    ".json": "geojson",
    ".gpkg": "gpkg",
}
POLYGON_SUFFIXES = tuple(POLYGON_FORMATS)
#: The suffixes a GeoTIFF output may be named with (or none at all).
GEOTIFF_SUFFIXES = (".tif", ".tiff")
#: Suffixes taken off an output path used as a stem for several kinds.
OUTPUT_SUFFIXES = (*GEOTIFF_SUFFIXES, *POLYGON_SUFFIXES)


def kind_suffix(kind: str, polygon_format: str = DEFAULT_POLYGON_FORMAT) -> str:
    """The default file suffix of ``kind``'s output: ``.tif``; polygons: ``polygon_format``'s."""
    if kind == "polygons":
        return FORMAT_SUFFIX[polygon_format]
    return KIND_SUFFIX.get(kind, ".tif")


def check_geotiff_name(path: Path, kind: str = "the output") -> None:
    """Refuse to write a GeoTIFF under a name that says another format (``scene.png``).

    A GeoTIFF is named ``.tif`` / ``.tiff`` or has no suffix; any other would give a GIS tool
    (or a person) a GeoTIFF under another format's name.

    Raises:
        ConfigError: naming the path, the suffixes accepted, and ``--quicklook`` for a picture.
    """
    suffix = path.suffix.lower()
    if not suffix or suffix in GEOTIFF_SUFFIXES:
        return
    hint = ""
    if suffix in POLYGON_SUFFIXES:
        hint = f" ({suffix} names a vector format: only polygons are written as one)"
    elif suffix in (".png", ".jpg", ".jpeg", ".webp"):
        hint = (
            "; for a PNG picture of the input and the prediction, give "
            f"-o {path.with_suffix('.tif').name} --quicklook {path.with_suffix('.png').name}"
        )
    raise ConfigError(
        f"{path}: {kind} is a GeoTIFF: name it .tif or .tiff, not {path.suffix}{hint}"
    )


def product_paths(
    path: Path,
    kinds: Sequence[str],
    *,
    named: bool = True,
    polygon_format: str = DEFAULT_POLYGON_FORMAT,
) -> list[Path]:
    """Where each output kind of a request is written, given its output path.

    One kind: ``path`` itself (an engine-chosen name, ``named=False``, takes the kind's
    suffix). Several: ``path`` is a stem, each kind's file ``<stem>_<kind><suffix>`` (a
    ``.tif``-like or vector suffix on ``path`` is dropped first): ``scene_classes.tif``,
    ``scene_confidence.tif``, ``scene_polygons.gpkg`` (``polygon_format``'s suffix). A vector
    suffix on ``path`` (``scene.geojson``) chooses the polygons' format:
    ``scene_polygons.geojson``.
    """
    if len(kinds) == 1:
        return [path if named else path.with_suffix(kind_suffix(kinds[0], polygon_format))]
    suffix = path.suffix.lower()
    stem = path.with_suffix("") if suffix in OUTPUT_SUFFIXES else path
    polygons = path.suffix if suffix in POLYGON_SUFFIXES else FORMAT_SUFFIX[polygon_format]
    return [
        stem.with_name(f"{stem.name}_{kind}{polygons if kind == 'polygons' else kind_suffix(kind)}")
        for kind in kinds
    ]


def output_paths(
    items: Sequence[Any],
    directory: str | os.PathLike[str],
    kinds: Sequence[str] = ("classes",),
    polygon_format: str = DEFAULT_POLYGON_FORMAT,
) -> list[Path]:
    """One output path per input in ``directory`` (created), unique per stem.

    For one output kind ``<stem>_pred.tif`` (polygons: ``polygon_format``'s suffix, ``.gpkg``
    by default); for several, the
    stem ``<stem>`` that :func:`product_paths` names each kind's file after
    (``<stem>_classes.tif``, ...). An item that is a list (dates of one place) is named after
    its first date, a dict (modalities) after its first modality; inputs without a file name
    (bytes, arrays) become ``input_<i>``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    seen: dict[str, int] = {}
    paths = []
    for i, item in enumerate(items):
        first = item
        if isinstance(first, Mapping):
            first = next(iter(first.values()), None)
        if isinstance(first, list | tuple):
            first = first[0] if first else None
        stem = Path(str(first)).stem if isinstance(first, str | os.PathLike) else f"input_{i}"
        n = seen.get(stem, 0)
        seen[stem] = n + 1
        name = stem if n == 0 else f"{stem}_{n}"
        if len(kinds) == 1:
            name = f"{name}_pred{kind_suffix(kinds[0], polygon_format)}"
        paths.append(directory / name)
    return paths


def planned_paths(
    items: Sequence[Any],
    output_path: str | os.PathLike[str],
    kinds: Sequence[str],
    polygon_format: str,
    single: bool,
) -> list[Path]:
    """Where the outputs of ``items`` go, one path each (the engine's and the CLI's rule).

    A single input's ``output_path`` is its file (with several output kinds, their stem)
    unless it is a directory (one that exists, or a path ending with ``/``): then, as for a
    list, each input's outputs are named after it inside (:func:`output_paths`). A directory
    is created if missing.

    Raises:
        ConfigError: the directory cannot be created (naming it).
    """
    out = Path(output_path)
    directory = os.fspath(output_path).endswith(("/", os.sep)) or out.is_dir()
    if single and not directory:
        return [out]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the directory ({exc.strerror or exc})") from None
    return output_paths(items, out, kinds, polygon_format)
