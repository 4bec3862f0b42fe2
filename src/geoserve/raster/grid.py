"""The patch grid: where patches sit on an image and how their outputs are blended back.

A :class:`PatchGrid` is a frozen value computed per request from the image size and the input
processor's ``patch_size``/``stride``/``blend``. It is never stored on a processor.

Geometry (one axis; the other is the same). With patch size ``P``, stride ``S`` and margin
``m = (P - S) // 2``, patch ``i`` covers image rows ``[i*S - m, i*S - m + P)`` and its *core* is
rows ``[i*S, i*S + S)``. There are ``ceil(H / S)`` patches per axis, so the cores tile the image
exactly once: every pixel is covered for any image size, including images smaller than a patch
and 1-pixel strips. Patch areas outside the image are filled by reflection (see
:func:`reflect_indices`) and cropped off again when the output is stitched.

Why start at ``-m`` rather than 0: the first core then sits ``m`` pixels inside its patch, like
every other core, so the image border is never on a patch edge where a model's receptive field
is cut short. A model whose receptive radius is ``<= m`` therefore gives, with ``center`` blending,
exactly the output it would give on the whole image (away from the image border, where the
fill differs from the whole-image zero padding).

Blend modes:

- ``none``: non-overlapping patches (``S == P``, ``m == 0``); each output pixel from one patch.
- ``center``: keep only each patch's core. An identity model reproduces its input exactly.
- ``mean``: plain average of every patch covering a pixel.
- ``cosine``: average weighted by a raised-cosine taper over the overlap band, with a small
  floor so pixels seen by one patch only keep a valid weight; seams fade out.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import NDArray
from rasterio.windows import Window

from geoserve.errors import ConfigError

BlendMode = Literal["none", "center", "mean", "cosine"]
BLEND_MODES: tuple[str, ...] = get_args(BlendMode)

#: Smallest taper weight: keeps pixels that only one patch covers well defined.
COSINE_FLOOR = 1e-3


def check_tiling(patch_size: int, stride: int, blend: str) -> None:
    """Validate a tiling configuration.

    Raises:
        ConfigError: naming the offending field and value.
    """
    if blend not in BLEND_MODES:
        raise ConfigError(f"invalid blend: {blend!r}; choose one of {', '.join(BLEND_MODES)}")
    if not isinstance(patch_size, int) or patch_size < 1:
        raise ConfigError(f"invalid patch_size: {patch_size!r}; must be a positive integer")
    if not isinstance(stride, int) or not 1 <= stride <= patch_size:
        raise ConfigError(
            f"invalid stride: {stride!r}; must be an integer in 1..patch_size ({patch_size})"
        )
    if blend == "none" and stride != patch_size:
        raise ConfigError(
            f"blend 'none' means non-overlapping patches: stride ({stride}) must equal "
            f"patch_size ({patch_size})"
        )


@dataclass(frozen=True)
class PatchGrid:
    """Patch placement for one image; see the module docstring for the geometry."""

    height: int
    width: int
    patch_size: int
    stride: int
    blend: BlendMode

    def __post_init__(self) -> None:
        check_tiling(self.patch_size, self.stride, self.blend)
        if self.height < 1 or self.width < 1:
            raise ConfigError(f"image size {self.width}x{self.height} has no pixels")

    @property
    def margin(self) -> int:
        """Pixels between a patch's edge and its core on the top/left side."""
        return (self.patch_size - self.stride) // 2

    @property
    def rows(self) -> int:
        """Number of patch rows."""
        return math.ceil(self.height / self.stride)

    @property
    def cols(self) -> int:
        """Number of patch columns."""
        return math.ceil(self.width / self.stride)

    def __len__(self) -> int:
        return self.rows * self.cols

    def origin(self, row: int, col: int) -> tuple[int, int]:
        """Image (row, col) of a patch's top-left corner; may be negative."""
        return row * self.stride - self.margin, col * self.stride - self.margin

    def window(self, row: int, col: int) -> Window:
        """The patch's full window in image coordinates (may extend past the image)."""
        r0, c0 = self.origin(row, col)
        return Window(c0, r0, self.patch_size, self.patch_size)

    def core_window(self, row: int, col: int) -> Window:
        """The part of the image this patch alone is responsible for (clipped to the image)."""
        r0, c0 = row * self.stride, col * self.stride
        return Window(c0, r0, min(self.stride, self.width - c0), min(self.stride, self.height - r0))

    def indices(self) -> Iterator[tuple[int, int]]:
        """Patch (row, col) pairs in row-major order."""
        for r in range(self.rows):
            for c in range(self.cols):
                yield r, c

    def weights(self) -> NDArray[np.float32]:
        """The (P, P) blend weights of one patch (shared, read-only)."""
        return _weights(self.patch_size, self.stride, self.blend)


@functools.lru_cache(maxsize=32)
def _weights(patch_size: int, stride: int, blend: str) -> NDArray[np.float32]:
    m = (patch_size - stride) // 2
    if blend in ("none", "mean"):
        w1 = np.ones(patch_size, dtype=np.float64)
    elif blend == "center":
        w1 = np.zeros(patch_size, dtype=np.float64)
        w1[m : m + stride] = 1.0
    else:  # cosine: taper over the overlap band at each end
        ramp = patch_size - stride
        x = np.arange(patch_size, dtype=np.float64)
        if ramp == 0:
            w1 = np.ones(patch_size)
        else:
            up = 0.5 * (1 - np.cos(np.pi * np.minimum(x + 0.5, ramp) / ramp))
            w1 = np.minimum(up, up[::-1])
        w1 = np.maximum(w1, COSINE_FLOOR)
    w = np.outer(w1, w1).astype(np.float32)
    w.setflags(write=False)
    return w


def reflect_indices(start: int, length: int, size: int) -> NDArray[np.intp]:
    """Indices into an axis of ``size`` for positions ``start .. start+length-1``.

    Positions outside ``[0, size)`` are mirrored about the edge pixels (numpy's ``reflect``),
    repeatedly if needed, so a patch larger than the image is still filled from real pixels.
    The fill depends only on the position, never on how the image is read.
    """
    pos = np.arange(start, start + length)
    if size == 1:
        return np.zeros(length, dtype=np.intp)
    period = 2 * (size - 1)
    pos = np.mod(pos, period)
    return np.where(pos >= size, period - pos, pos).astype(np.intp)
