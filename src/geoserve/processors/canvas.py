"""Stitching output patches back into one image (the per-request accumulator).

A :class:`Canvas` belongs to one request. It places each output patch at its grid position,
crops whatever lies outside the image, and combines overlaps as the grid's blend mode says:
``center`` and ``none`` copy each patch's core (exact, no arithmetic), ``mean`` and ``cosine``
accumulate weighted sums in float32 and divide by the summed weights at the end.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from geoserve.raster.grid import PatchGrid


class Canvas:
    """Accumulates one request's output patches; see the module docstring."""

    def __init__(self, grid: PatchGrid) -> None:
        self.grid = grid
        self._acc: NDArray[np.float32] | None = None
        self._wsum: NDArray[np.float32] | None = None
        self._valid: NDArray[np.bool_] | None = None
        self._exact = grid.blend in ("center", "none")

    def _alloc(self, channels: int) -> NDArray[np.float32]:
        g = self.grid
        self._acc = np.zeros((channels, g.height, g.width), dtype=np.float32)
        if not self._exact:
            self._wsum = np.zeros((g.height, g.width), dtype=np.float32)
        return self._acc

    def add(self, row: int, col: int, patch: NDArray[np.float32]) -> None:
        """Place output patch (C, P, P) of grid cell (row, col)."""
        g = self.grid
        acc = self._acc if self._acc is not None else self._alloc(patch.shape[0])
        r0, c0 = g.origin(row, col)
        if self._exact:
            core = g.core_window(row, col)
            pr, pc = core.row_off - r0, core.col_off - c0
            acc[
                :,
                core.row_off : core.row_off + core.height,
                core.col_off : core.col_off + core.width,
            ] = patch[:, pr : pr + core.height, pc : pc + core.width]
            return
        assert self._wsum is not None
        rs, re_ = max(r0, 0), min(r0 + g.patch_size, g.height)
        cs, ce = max(c0, 0), min(c0 + g.patch_size, g.width)
        w = g.weights()[rs - r0 : re_ - r0, cs - c0 : ce - c0]
        acc[:, rs:re_, cs:ce] += patch[:, rs - r0 : re_ - r0, cs - c0 : ce - c0] * w
        self._wsum[rs:re_, cs:ce] += w

    def set_valid(self, row: int, core_valid: NDArray[np.bool_] | None) -> None:
        """Record the input validity of grid row ``row``'s core rows (None: all valid)."""
        if core_valid is None:
            if self._valid is not None:
                self._set_rows(row, True)
            return
        if self._valid is None:
            self._valid = np.ones((self.grid.height, self.grid.width), dtype=bool)
        self._set_rows(row, core_valid)

    def _set_rows(self, row: int, value: NDArray[np.bool_] | bool) -> None:
        assert self._valid is not None
        core = self.grid.core_window(row, 0)
        self._valid[core.row_off : core.row_off + core.height] = value

    @property
    def valid(self) -> NDArray[np.bool_] | None:
        """(H, W) mask of valid input pixels, or None when every pixel was valid."""
        return self._valid

    def result(self, channels: int) -> NDArray[np.float32]:
        """The blended (C, H, W) output. Pixels no patch reached (all-nodata) are 0."""
        acc = self._acc if self._acc is not None else self._alloc(channels)
        if self._wsum is not None:
            np.divide(acc, self._wsum, out=acc, where=self._wsum > 0)
        return acc
