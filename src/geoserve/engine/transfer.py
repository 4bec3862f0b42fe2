"""Copies between host and device: batches staged on the way in, outputs on the way out.

:class:`Staging` stacks a CPU batch of host patches into a buffer reused from batch to batch,
never while anything still references the batch last staged there.

Device -> host: :func:`to_host` is the one door every tensor of the engine's loop takes to the
host. :func:`to_host` starts the copy and returns a :class:`HostCopy`; :meth:`HostCopy.wait` gives
the numpy array. On CUDA the copy runs asynchronously on the current stream into page-locked
(pinned) memory from torch's caching host allocator, which keeps that memory from being reused
until the copy is done, and an event marks its end: the host waits only when it reads the
values, as late as the caller can make it (a band of finished rows waits on the writer thread,
see :class:`~geoserve.engine.canvas.RowBand`). Elsewhere it is a plain conversion (a CPU tensor
is already on the host; any other device copies synchronously).

The engine calls it through this module (``transfer.to_host``), so a test can count the copies
per step by wrapping the module attribute.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

#: Staging buffers per key; a batch finding all of them still referenced gets a new array.
STAGING_BUFFERS = 2


class _Slot:
    """One staging buffer and a weak reference to the last batch staged in it."""

    __slots__ = ("buf", "last")

    def __init__(self, buf: NDArray[Any]) -> None:
        self.buf = buf
        self.last: weakref.ref[NDArray[Any]] | None = None

    def free(self) -> bool:
        return self.last is None or self.last() is None


class Staging:
    """Reused host buffers that CPU batches are stacked into, per modality key.

    A buffer is reused only once nothing references the batch last staged in it. The batch
    tensor (``torch.from_numpy`` of a view of the buffer) holds that view, and so does
    everything sharing its memory: a model's output that is a view of its input (an identity,
    a slice of its channels), its numpy array, a slice of that; a weak reference to the view
    tells when all are gone. Until then the next batch goes into another buffer (at most
    :data:`STAGING_BUFFERS` per key, then into a new array), so no batch ever overwrites memory
    an output of an earlier one still uses, however long it is kept.
    """

    def __init__(self) -> None:
        self._slots: dict[str | None, list[_Slot]] = {}

    def stack(self, arrays: list[NDArray[Any]], key: str | None) -> torch.Tensor:
        """``np.stack(arrays)`` as a tensor, over a free buffer of ``key`` when there is one.

        A free buffer too small for the batch, or of another patch shape or dtype, is replaced.
        Arrays of different shapes or dtypes are stacked by ``np.stack`` itself (it promotes
        or refuses them).
        """
        first = arrays[0]
        if any(a.shape != first.shape or a.dtype != first.dtype for a in arrays):
            return torch.from_numpy(np.stack(arrays))
        n = len(arrays)
        slots = self._slots.setdefault(key, [])
        slot = next((s for s in slots if s.free()), None)
        if slot is None and len(slots) < STAGING_BUFFERS:
            slot = _Slot(np.empty((0, *first.shape), dtype=first.dtype))
            slots.append(slot)
        if slot is None:  # every buffer still referenced
            return torch.from_numpy(np.stack(arrays))
        buf = slot.buf
        if buf.shape[1:] != first.shape or buf.dtype != first.dtype or buf.shape[0] < n:
            rows = max(n, buf.shape[0]) if buf.shape[1:] == first.shape else n
            buf = slot.buf = np.empty((rows, *first.shape), dtype=first.dtype)
        view = buf[:n]
        np.stack(arrays, out=view)
        slot.last = weakref.ref(view)
        return torch.from_numpy(view)


class HostCopy:
    """A tensor's values on the host, possibly still on their way (see :func:`to_host`)."""

    __slots__ = ("_array", "_event")

    def __init__(self, array: NDArray[Any], event: torch.cuda.Event | None = None) -> None:
        self._array = array
        self._event = event

    def wait(self) -> NDArray[Any]:
        """The values, once the copy is done (blocks until then; any thread may call it)."""
        event = self._event
        if event is not None:
            event.synchronize()
            self._event = None
        return self._array


def to_host(tensor: torch.Tensor, *, copy: bool = False) -> HostCopy:
    """Start copying ``tensor`` to the host.

    ``copy``: the result must not share memory with ``tensor`` (a CPU tensor is otherwise
    handed out as it is, its numpy view; a CUDA tensor always lands in new pinned memory).
    """
    tensor = tensor.detach()
    if tensor.device.type == "cuda":
        pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        pinned.copy_(tensor, non_blocking=True)
        # blocking: a thread waiting for it sleeps instead of spinning a core
        event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(tensor.device))  # the copy's stream, after it
        return HostCopy(pinned.numpy(), event)
    if tensor.device.type != "cpu":  # another accelerator: a synchronous copy, already new
        return HostCopy(tensor.cpu().numpy())
    array = tensor.numpy()
    return HostCopy(array.copy() if copy else array)


def shares_memory(a: torch.Tensor, b: torch.Tensor | NDArray[Any]) -> bool:
    """Whether tensor ``a``'s storage overlaps ``b``: a tensor's storage, or a contiguous array."""
    sa = a.untyped_storage()
    lo, hi = sa.data_ptr(), sa.data_ptr() + sa.nbytes()
    if isinstance(b, np.ndarray):
        if a.device.type != "cpu":
            return False
        blo = int(b.__array_interface__["data"][0])
        bhi = blo + b.nbytes
    else:
        if b.device != a.device:
            return False
        sb = b.untyped_storage()
        blo, bhi = sb.data_ptr(), sb.data_ptr() + sb.nbytes()
    return lo < hi and blo < bhi and lo < bhi and blo < hi


class DeviceSpan:
    """CUDA events around work queued on a device: its time there, read later without a wait.

    :meth:`seconds` is read once the work is known to be done (a request's outputs are
    written), so timing a forward pass never makes the loop wait for the device. Off CUDA
    there is nothing to time and it says 0.
    """

    __slots__ = ("_device", "_end", "_start", "patches")

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._start: Any = None
        self._end: Any = None
        self.patches = 1  # the work's patches: each has this share of its time
        if device.type == "cuda":
            self._start = self._mark()

    def _mark(self) -> Any:
        """An event recorded on the device's current stream (not the current device's)."""
        event = torch.cuda.Event(enable_timing=True, blocking=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self._device))
        return event

    def stop(self, patches: int = 1) -> None:
        """Mark the end of the work queued since the span began (for ``patches`` patches)."""
        self.patches = max(1, patches)
        if self._start is not None:
            self._end = self._mark()

    def seconds(self) -> float:
        """The device's time between the two marks (waits for the end mark if needed)."""
        if self._end is None:
            return 0.0
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end)) / 1000
