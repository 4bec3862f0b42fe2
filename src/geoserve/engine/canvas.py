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
Those rows cross through :func:`geoserve.engine.transfer.to_host` without the main thread
waiting: on a GPU the copy runs asynchronously into pinned memory and the writer thread waits
for it when it reads :attr:`RowBand.data`.

Costs kept off the model loop's thread: a patch is weighed into one scratch buffer reused for
every patch (``patch * w`` into it, then added in place: the same two float32 operations as
``acc += patch * w``); finished rows are divided by their summed weights straight into the
band handed out, rows no patch weighed dividing by 1.0 (``x / 1.0 == x`` exactly, the value
the former ``where`` kept); and dropping taken rows moves up and clears only the rows some
patch wrote (the canvas tracks the lowest), not the buffer's whole capacity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from geoserve.engine import transfer
from geoserve.raster.grid import PatchGrid


class RowBand:
    """Finished output rows ``[row, row + data.shape[1])``.

    Attributes:
        row: First image row of the band.
        data: Blended (C, rows, W) float32 output, or what the output processor's
            ``reduce_rows`` made of it on the device. Rows of a device canvas may still be on
            their way: reading ``data`` waits for them (on the writer thread).
        valid: (rows, W) mask of valid input pixels, or ``None`` when all are valid.
    """

    __slots__ = ("_data", "row", "valid")

    def __init__(
        self,
        row: int,
        data: NDArray[Any] | transfer.HostCopy,
        valid: NDArray[np.bool_] | None,
    ) -> None:
        self.row = row
        self._data = data
        self.valid = valid

    @property
    def data(self) -> NDArray[Any]:
        """The band's values (waits for a copy from the device to finish)."""
        data = self._data
        if isinstance(data, transfer.HostCopy):
            data = self._data = data.wait()
        return data


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
        self._high = 0  # image rows _high and below are zeros in _acc and _wsum (none written)
        self._tmp: Any = None  # (C, P, P) scratch: one patch times its weights
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
        written = min(held, max(0, self._high - self._top))  # the rest is zeros
        acc = self._zeros(channels, cap, g.width)
        if self._acc is not None:
            acc[:, :written] = self._acc[:, :written]
        self._acc = acc
        if not self._exact:
            wsum = self._zeros(cap, g.width)
            if self._wsum is not None:
                wsum[:written] = self._wsum[:written]
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
            self._high = max(self._high, core.row_off + core.height)
        else:
            rs, re_ = max(r0, 0), min(r0 + g.patch_size, g.height)
            cs, ce = max(c0, 0), min(c0 + g.patch_size, g.width)
            acc = self._ensure(patch.shape[0], re_)
            assert self._wsum is not None
            w = self._weights()[rs - r0 : re_ - r0, cs - c0 : ce - c0]
            ts, te = rs - self._top, re_ - self._top
            src: Any = patch[:, rs - r0 : re_ - r0, cs - c0 : ce - c0]
            dst = acc[:, ts:te, cs:ce]
            tmp = self._scratch(src)
            if tmp is None:  # not float32 (or not where the canvas is): numpy/torch promote
                dst += src * w
            elif isinstance(tmp, np.ndarray):  # the same two operations, no temporary
                np.multiply(src, w, out=tmp)
                np.add(dst, tmp, out=dst)
            else:
                torch.mul(src, w, out=tmp)
                dst.add_(tmp)
            self._wsum[ts:te, cs:ce] += w
            self._high = max(self._high, re_)
        self._pending[row] -= 1
        self._advance()

    def _scratch(self, src: Any) -> Any:
        """A view of the reused (C, P, P) scratch buffer shaped like ``src``.

        ``None`` when ``src`` is not float32 where the canvas is (then ``src * w`` promotes,
        and the canvas computes it as it always did).
        """
        if self.device is None:
            if not isinstance(src, np.ndarray) or src.dtype != np.float32:
                return None
        elif not (
            isinstance(src, torch.Tensor)
            and src.dtype == torch.float32
            and src.device == self._acc.device
        ):
            return None
        c, h, w = src.shape
        tmp = self._tmp
        if tmp is None or tmp.shape[0] != c:
            p = self.grid.patch_size
            tmp = self._tmp = self._zeros(c, p, p)
        return tmp[:, :h, :w]

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
        wsum = None
        if self._wsum is not None:
            # rows no patch weighed (all skipped) divide by 1.0: x / 1.0 == x exactly, the value
            # the former `where=wsum > 0` kept; these rows are dropped below
            wsum = self._wsum[:n]
            if self.device is None:
                np.copyto(wsum, np.float32(1.0), where=np.logical_not(wsum > 0))
            else:
                wsum.masked_fill_(wsum.gt(0).logical_not(), 1.0)
        data: NDArray[Any] | transfer.HostCopy
        if self.device is None:
            data = acc[:, :n].copy() if wsum is None else np.divide(acc[:, :n], wsum)
        else:  # the same division on the device; only the finished rows come back
            rows = acc[:, :n]
            if wsum is not None:
                rows = rows / wsum
            if reduce is not None:
                rows = reduce(rows)
            # (no wait here: on a GPU the writer thread waits when it reads the band)
            data = transfer.to_host(rows, copy=transfer.shares_memory(rows, acc))
        valid = None
        if self._valid is not None:
            self._valid_grow(stop)
            valid = self._valid[:n].copy()
        band = RowBand(self._top, data, valid)
        self._drop(n)
        return band

    def _drop(self, n: int) -> None:
        """Forget the first ``n`` held rows, keeping the buffer's capacity for reuse.

        Of the accumulators only rows ``[n, high)`` hold data (no patch wrote further down):
        those move up and what they leave behind (and the taken rows' weights) is cleared.
        """
        assert self._acc is not None
        held = self._acc.shape[1]
        high = min(held, max(0, self._high - self._top))
        keep = max(0, high - n)
        clear = min(held, max(high, n))
        for buf in (self._acc, self._wsum):
            if buf is not None:
                _move_up(buf, n, keep)
                buf[..., keep:clear, :] = 0
        if self._valid is not None:
            rows = self._valid.shape[0]
            keep_valid = max(0, rows - n)
            _move_up(self._valid, n, keep_valid)
            self._valid[keep_valid:] = True
        self._top += n
        self._high = max(self._high, self._top)
        # the buffer never needs to reach past the image: shrink it near the bottom
        remaining = self.grid.height - self._top
        if remaining < held:
            self._acc = self._acc[:, :remaining]
            if self._wsum is not None:
                self._wsum = self._wsum[:remaining]
        if self._valid is not None and remaining < self._valid.shape[0]:
            self._valid = self._valid[:remaining]


def _move_up(buf: Any, n: int, keep: int) -> None:
    """Rows ``[n, n + keep)`` of ``buf`` (rows on its second-to-last axis) to ``[0, keep)``.

    In chunks of at most ``n`` rows, top first, so no chunk reads rows already overwritten and
    no copy needs a temporary: numpy makes one whenever the bounds of source and destination
    overlap (any two row ranges of a multi-channel buffer), so numpy copies channel by channel.
    """
    start = 0
    while start < keep:
        size = min(n, keep - start)
        dst, src = slice(start, start + size), slice(n + start, n + start + size)
        if isinstance(buf, torch.Tensor):
            buf[..., dst, :].copy_(buf[..., src, :])
        elif buf.ndim == 2:
            buf[dst] = buf[src]
        else:
            for channel in buf:
                channel[dst] = channel[src]
        start += size
