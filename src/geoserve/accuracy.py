"""Does a faster setting change the answer? One scene, run in float32 and in the candidate.

:func:`compare_settings` runs a model twice over the same scene through :class:`~geoserve.Engine`
(the reference: float32, eager, not quantised; the candidate: the same configuration with its
speed options, e.g. ``quantize="int8"``), both as raw model outputs (the blended logits)
written to temporary GeoTIFFs, and compares them row band by row band, so a scene of any size
fits: the share of pixels whose class (the argmax) is the same, the largest absolute and
relative difference of the outputs, and each run's time. Given a label raster on the scene's
grid it also scores both against it (IoU per class). ``geoserve bench-accuracy`` prints it.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.windows import Window

from geoserve.config import EngineConfig
from geoserve.errors import ConfigError, InputError
from geoserve.raster.source import open_raster
from geoserve.raster.trust import DEFAULT_INPUT_FORMATS

#: The options that trade exactness for speed: the reference runs without them.
SPEED_OPTIONS: dict[str, Any] = {
    "quantize": None,
    "dtype": None,
    "compile": False,
    "backend": "torch",
    "precision": None,
    "calibrate": None,
}
#: Rows compared at a time.
ROWS = 512


@dataclass
class RunReport:
    """One of the two runs."""

    settings: str
    startup_s: float
    seconds: float
    iou: dict[str, float] = field(default_factory=dict)  # per class, with --labels


@dataclass
class AccuracyReport:
    """How the candidate's output differs from float32's on one scene."""

    model: str
    source: str
    pixels: int  # compared (valid in the reference)
    class_agreement: float | None  # None: the model's outputs are not classes
    nonfinite: int  # of them, NaN or inf in the candidate (counted as disagreeing)
    max_abs_error: float
    max_rel_error: float  # max |difference| / max |reference output|
    reference: RunReport
    candidate: RunReport

    @property
    def speedup(self) -> float:
        """Reference time / candidate time on this scene."""
        return self.reference.seconds / max(self.candidate.seconds, 1e-9)

    def as_json(self) -> dict[str, Any]:
        """Every field, and the speed-up."""
        return {**asdict(self), "speedup": self.speedup}

    def lines(self) -> list[str]:
        """The report for people."""
        ref, cand = self.reference, self.candidate
        out = [
            f"model {self.model} on {self.source}: {self.pixels} pixels compared",
            f"  reference  ({ref.settings}): {ref.seconds:.2f} s",
            f"  candidate  ({cand.settings}): {cand.seconds:.2f} s  "
            f"({self.speedup:.2f}x the reference's speed)",
        ]
        if self.class_agreement is not None:
            out.append(f"  class agreement: {100 * self.class_agreement:.3f} %")
        if self.nonfinite:
            out.append(f"  NaN or inf in the candidate: {self.nonfinite} pixels")
        out.append(
            f"  max output difference: {self.max_abs_error:.4g} "
            f"({100 * self.max_rel_error:.3f} % of the largest output)"
        )
        for run, label in ((ref, "reference"), (cand, "candidate")):
            if run.iou:
                ious = ", ".join(f"{k} {v:.4f}" for k, v in run.iou.items())
                out.append(f"  IoU against the labels, {label}: {ious}")
        return out


def settings_of(cfg: EngineConfig) -> str:
    """The speed options of ``cfg`` in words ("quantize=int8", or "float32")."""
    said = [f"{k}={getattr(cfg, k)}" for k, v in SPEED_OPTIONS.items() if getattr(cfg, k) != v]
    return ", ".join(said) or "float32"


def compare_settings(
    model: str,
    source: str | Path,
    candidate: EngineConfig,
    *,
    labels: str | Path | None = None,
    workdir: str | Path | None = None,
) -> AccuracyReport:
    """Run ``model`` on ``source`` in float32 and with ``candidate``'s options; compare.

    Raises:
        ConfigError: ``candidate`` has no speed option to compare (it would equal the
            reference), or an option is invalid for this machine.
        InputError, GeoServeError: the scene or the labels cannot be used.
    """
    from geoserve.engine import Engine, resolve_model

    if settings_of(candidate) == "float32":
        raise ConfigError(
            "bench-accuracy: nothing to compare; give the faster setting to check "
            "(--quantize int8, --dtype bf16, --compile or --backend openvino)"
        )
    reference = EngineConfig.build(candidate, **SPEED_OPTIONS)
    if labels is not None:
        _check_labels(Path(labels), source, candidate.allowed_formats)
    _, _, out_proc = resolve_model(model)
    classes = list(getattr(out_proc, "classes", ()) or ())
    is_classes = out_proc.kind == "classes"
    runs: list[RunReport] = []
    with tempfile.TemporaryDirectory(dir=workdir, prefix="geoserve-accuracy-") as tmp:
        paths = []
        for name, cfg in (("reference", reference), ("candidate", candidate)):
            t0 = time.perf_counter()
            with Engine(model, cfg, output_kind=["raw"]) as engine:
                started = time.perf_counter()
                path = Path(tmp) / f"{name}.tif"
                engine.generate_image(str(source), output_path=path)
                done = time.perf_counter()
            runs.append(RunReport(settings_of(cfg), started - t0, done - started))
            paths.append(path)
        stats = compare_outputs(paths[0], paths[1], is_classes)
        if labels is not None:
            for run, path in zip(runs, paths, strict=True):
                run.iou = iou_against(path, Path(labels), classes, candidate.allowed_formats)
    return AccuracyReport(
        model,
        str(source),
        stats["pixels"],
        stats["agreement"] if is_classes else None,
        stats["nonfinite"],
        stats["max_abs"],
        stats["max_abs"] / max(stats["max_ref"], 1e-30),
        runs[0],
        runs[1],
    )


def compare_outputs(ref_path: Path, cand_path: Path, is_classes: bool) -> dict[str, Any]:
    """What two raw outputs of one scene share and how far apart they are.

    Returns ``pixels`` (valid in the reference), ``agreement`` (share of them with the same
    argmax in the candidate), ``nonfinite`` (of them, those the candidate gave NaN or inf:
    counted as disagreeing), ``max_abs`` (largest difference where both are finite; inf when
    the candidate has non-finite values) and ``max_ref`` (largest reference value).
    """
    pixels = same = nonfinite = 0
    max_abs = max_ref = 0.0
    with rasterio.open(ref_path) as ref, rasterio.open(cand_path) as cand:
        for row in range(0, ref.height, ROWS):
            window = Window(0, row, ref.width, min(ROWS, ref.height - row))
            a, b = ref.read(window=window), cand.read(window=window)
            valid = np.isfinite(a).all(axis=0)
            if not valid.any():
                continue
            finite = valid & np.isfinite(b).all(axis=0)
            pixels += int(valid.sum())
            nonfinite += int(valid.sum() - finite.sum())
            max_ref = max(max_ref, float(np.abs(a[:, valid]).max()))
            if finite.any():
                av, bv = a[:, finite], b[:, finite]
                max_abs = max(max_abs, float(np.abs(av - bv).max()))
                if is_classes:
                    same += int((av.argmax(axis=0) == bv.argmax(axis=0)).sum())
    return {
        "pixels": pixels,
        "agreement": same / max(pixels, 1),
        "nonfinite": nonfinite,
        "max_abs": math.inf if nonfinite else max_abs,
        "max_ref": max_ref,
    }


def _check_labels(labels: Path, source: str | Path, formats: Sequence[str]) -> None:
    """Labels that open under the input trust rules, on the scene's grid (before any run)."""
    with open_raster(str(labels), "path", formats=formats) as lab:
        size = lab.info.width, lab.info.height
    with open_raster(str(source), formats=formats) as src:
        want = src.info.width, src.info.height
    if size != want:
        raise InputError(
            f"{labels}: labels are {size[0]} x {size[1]} pixels, the scene {want[0]} x "
            f"{want[1]}; give labels on the scene's grid"
        )


def iou_against(
    pred_path: Path,
    label_path: Path,
    classes: list[str],
    formats: Sequence[str] = DEFAULT_INPUT_FORMATS,
) -> dict[str, float]:
    """IoU per class of the prediction's argmax against integer labels (negative: ignored).

    The labels are opened like any input (``formats``: the GDAL formats they may be in).
    """
    with (
        rasterio.open(pred_path) as pred,
        open_raster(str(label_path), "path", formats=formats) as lab,
    ):
        n = pred.count
        inter, union = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for row in range(0, pred.height, ROWS):
            stop = min(pred.height, row + ROWS)
            p = pred.read(window=Window(0, row, pred.width, stop - row))
            truth = lab.read_rows(row, stop, [0])[0]
            valid = np.isfinite(p).all(axis=0) & (truth >= 0)
            if lab.info.nodata is not None:
                valid &= truth != lab.info.nodata
            guess = p.argmax(axis=0)
            for c in range(n):
                g, t = (guess == c) & valid, (truth == c) & valid
                inter[c] += int((g & t).sum())
                union[c] += int((g | t).sum())
    names = classes if len(classes) == n else [str(c) for c in range(n)]
    return {
        name: float(i / u) if u else float("nan")
        for name, i, u in zip(names, inter, union, strict=True)
    }
