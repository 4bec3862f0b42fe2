"""Stitching output patches back into one image, a band of rows at a time.

A :class:`Canvas` belongs to one request. It places each output patch at its grid position,
crops whatever lies outside the image, and combines overlaps as the grid's blend mode says:
``center`` and ``none`` copy each patch's core (exact, no arithmetic), ``mean`` and ``cosine``
accumulate weighted sums in float32 and divide by the summed weights.

Why rows: the canvas only holds the image rows that some unfinished patch row can still write
to. Once grid rows ``0 .. k-1`` are complete (every patch stitched or skipped), no later patch
touches image rows above ``k*S`` (exact modes) or ``k*S - m`` (blending modes), so those rows are
final: :meth:`Canvas.take_finished` hands them out and drops them. Memory therefore grows with
the image width times a few patch heights, never with the scene's area, and the output can be
written while the model is still running. Taking everything at the end instead gives the same
numbers bit for bit (the same sums in the same order); that is the in-memory mode.

With a ``device``, the accumulator lives there as a torch tensor (on a GPU: next to the model's
outputs, which then never leave it), and only finished rows are copied back to the host. The
arithmetic is the same float32 operations in the same order, so the result is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.raster.grid import PatchGrid


@dataclass(frozen=True)
class RowBand:
    """Finished output rows ``[row, row + data.shape[1])``.

    Attributes:
        row: First image row of the band.
        data: Blended (C, rows, W) float32 output, or what the output processor's
            ``reduce_rows`` made of it on the device.
        valid: (rows, W) mask of valid input pixels, or ``None`` when all are valid.
    """

    row: int
    data: NDArray[Any]
    valid: NDArray[np.bool_] | None


class Canvas:
    """Accumulates one request's output patches over its open rows; see the module docstring."""

    def __init__(self, grid: PatchGrid, device: torch.device | None = None) -> None:
        self.grid = grid
        self.device = device
        self._exact = grid.blend in ("center", "none")
        self._top = 0  # image row held in buffer row 0 (every row above it has been taken)
        # numpy arrays on the host, or torch tensors on ``device``
        self._acc: Any = None  # (C, rows held, W)
        self._wsum: Any = None  # (rows held, W), blending modes only
        self._w: Any = None  # the patch blend weights, on the device
        self._valid: NDArray[np.bool_] | None = None  # (rows held, W), once any pixel is invalid
        self._pending: dict[int, int] = {}  # grid row -> patches not yet stitched
        self._complete = 0  # grid rows 0 .. _complete-1 are complete

    # -- buffer ----------------------------------------------------------------------------

    @property
    def rows_held(self) -> int:
        """Image rows currently held in memory (for tests and metrics)."""
        return 0 if self._acc is None else self._acc.shape[1]

    def _zeros(self, *shape: int) -> Any:
        if self.device is None:
            return np.zeros(shape, dtype=np.float32)
        return torch.zeros(shape, dtype=torch.float32, device=self.device)

    def _weights(self) -> Any:
        if self.device is None:
            return self.grid.weights()
        if self._w is None:
            self._w = torch.from_numpy(self.grid.weights().copy()).to(self.device)
        return self._w

    def _ensure(self, channels: int, stop: int) -> Any:
        """Make the buffer hold image rows ``[_top, stop)``; grows by whole patch heights."""
        g = self.grid
        need = min(stop, g.height) - self._top
        if self._acc is not None and self._acc.shape[1] >= need:
            return self._acc
        held = self.rows_held
        cap = min(g.height - self._top, max(need, held + g.patch_size))
        acc = self._zeros(channels, cap, g.width)
        if self._acc is not None:
            acc[:, :held] = self._acc
        self._acc = acc
        if not self._exact:
            wsum = self._zeros(cap, g.width)
            if self._wsum is not None:
                wsum[:held] = self._wsum
            self._wsum = wsum
        if self._valid is not None:
            self._valid_grow(self._top + cap)
        return acc

    # -- input side ------------------------------------------------------------------------

    def expect(self, row: int, patches: int, core_valid: NDArray[np.bool_] | None) -> None:
        """Announce grid row ``row``: how many patches it sends, and its input validity.

        ``core_valid`` covers the row's core rows (``None``: all valid).
        """
        self._pending[row] = patches
        if core_valid is not None:
            g = self.grid
            core = g.core_window(row, 0)
            if self._valid is None:
                self._valid = np.ones((self.rows_held, g.width), dtype=bool)
            self._valid_grow(core.row_off + core.height)
            start = core.row_off - self._top
            self._valid[start : start + core.height] = core_valid
        self._advance()

    def _valid_grow(self, stop: int) -> None:
        assert self._valid is not None
        need = min(stop, self.grid.height) - self._top
        if self._valid.shape[0] < need:
            valid = np.ones((need, self.grid.width), dtype=bool)
            valid[: self._valid.shape[0]] = self._valid
            self._valid = valid

    # -- output side -----------------------------------------------------------------------

    def add(self, row: int, col: int, patch: NDArray[np.float32] | torch.Tensor) -> None:
        """Place output patch (C, P, P) of grid cell (row, col).

        The patch is a tensor on the canvas's device when it has one.
        """
        g = self.grid
        r0, c0 = g.origin(row, col)
        if self._exact:
            core = g.core_window(row, col)
            acc = self._ensure(patch.shape[0], core.row_off + core.height)
            pr, pc = core.row_off - r0, core.col_off - c0
            top = core.row_off - self._top
            acc[:, top : top + core.height, core.col_off : core.col_off + core.width] = patch[
                :, pr : pr + core.height, pc : pc + core.width
            ]
        else:
            rs, re_ = max(r0, 0), min(r0 + g.patch_size, g.height)
            cs, ce = max(c0, 0), min(c0 + g.patch_size, g.width)
            acc = self._ensure(patch.shape[0], re_)
            assert self._wsum is not None
            w = self._weights()[rs - r0 : re_ - r0, cs - c0 : ce - c0]
            ts, te = rs - self._top, re_ - self._top
            acc[:, ts:te, cs:ce] += patch[:, rs - r0 : re_ - r0, cs - c0 : ce - c0] * w
            self._wsum[ts:te, cs:ce] += w
        self._pending[row] -= 1
        self._advance()

    def _advance(self) -> None:
        while self._pending.get(self._complete) == 0:
            del self._pending[self._complete]
            self._complete += 1

    @property
    def complete(self) -> bool:
        """Whether every grid row is complete."""
        return self._complete >= self.grid.rows

    def final_rows(self) -> int:
        """Image rows ``[0, n)`` that no unfinished patch can change any more."""
        g = self.grid
        if self.complete:
            return g.height
        limit = self._complete * g.stride - (0 if self._exact else g.margin)
        return max(0, min(limit, g.height))

    def take_finished(
        self,
        channels: int,
        *,
        min_rows: int = 1,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> RowBand | None:
        """Hand out (and forget) the final rows not taken yet.

        Returns ``None`` unless there are at least ``min_rows`` of them or the image is complete.

        ``channels`` sizes the output when no patch was ever added (an all-nodata image).
        ``reduce`` runs on the device canvas's blended rows before they are copied back (e.g.
        argmax: one byte per pixel crosses instead of one float per class); a host canvas
        ignores it.
        """
        stop = self.final_rows()
        n = stop - self._top
        if n <= 0 or (n < min_rows and not self.complete):
            return None
        acc = self._ensure(channels, stop)
        if self.device is None:
            data = acc[:, :n].copy()
            if self._wsum is not None:
                np.divide(data, self._wsum[:n], out=data, where=self._wsum[:n] > 0)
        else:  # the same division on the device; only the finished rows come back
            rows = acc[:, :n]
            if self._wsum is not None:
                wsum = self._wsum[:n]
                rows = torch.where(wsum > 0, rows / wsum, rows)
            if reduce is not None:
                rows = reduce(rows)
            data = rows.cpu().numpy().copy()
        valid = None
        if self._valid is not None:
            self._valid_grow(stop)
            valid = self._valid[:n].copy()
        band = RowBand(self._top, data, valid)
        self._drop(n)
        return band

    def _drop(self, n: int) -> None:
        """Forget the first ``n`` held rows, keeping the buffer's capacity for reuse."""
        assert self._acc is not None
        held = self._acc.shape[1]
        for buf, fill in ((self._acc, 0), (self._wsum, 0), (self._valid, True)):
            if buf is None:
                continue
            rows = buf.shape[-2]
            keep = max(0, rows - n)
            moved = buf[..., n : n + keep, :]
            buf[..., :keep, :] = moved.clone() if isinstance(moved, torch.Tensor) else moved.copy()
            buf[..., keep:, :] = fill
        self._top += n
        # the buffer never needs to reach past the image: shrink it near the bottom
        remaining = self.grid.height - self._top
        if remaining < held:
            self._acc = self._acc[:, :remaining]
            if self._wsum is not None:
                self._wsum = self._wsum[:remaining]
        if self._valid is not None and remaining < self._valid.shape[0]:
            self._valid = self._valid[:remaining]
