"""The request of :meth:`Engine.transform`: an already-normalised tensor in, raw values out.

It goes through the same grid, batching and stitching as a raster request
(:class:`~geoserve.engine.request.Request`); what differs is asked of it: its patch shape,
that no output processor runs (:meth:`TensorRequest.to_raster`) and its result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from geoserve.engine.canvas import RowBand
from geoserve.engine.request import Request
from geoserve.engine.request_spec import RequestSpec
from geoserve.errors import ConfigError, GeoServeError
from geoserve.processors.base import InputProcessor, ModelInput, OutputProcessor
from geoserve.processors.patcher import GeoTiffPatcher
from geoserve.raster.input_values import RasterArray
from geoserve.raster.write import OutputRaster
from geoserve.schemas import TOKEN_KINDS, VECTOR_KINDS, ImageOutput, TensorRequestOutput

if TYPE_CHECKING:
    import torch


@dataclass
class TensorRequest(Request):
    """A request of :meth:`Engine.transform`: a tensor in, the blended raw output back.

    The tensor is already normalised, and no output processor runs on the model's output.

    ``tensor_shape`` is the (C, T) shape its patches are unfolded to before the model (they
    are read as one raster of C x T bands).
    """

    tensor_shape: tuple[int, ...] = ()

    def patch_shape(self, p: int) -> tuple[int, ...]:
        """(*tensor_shape, P, P)."""
        return (*self.tensor_shape, p, p)

    def _model_layout(self, patches: ModelInput) -> Sequence[ModelInput]:
        assert not isinstance(patches, Mapping)
        if not len(patches):
            return patches  # type: ignore[return-value]
        return patches.reshape(len(patches), *self.tensor_shape, *patches.shape[-2:])  # type: ignore[return-value]

    def row_reducer(self) -> None:
        """None: raw values come back unreduced."""
        return

    def to_raster(self, band: RowBand) -> OutputRaster:
        """The blended values as they are."""
        return OutputRaster(band.data)

    def result(
        self,
        output: ImageOutput | None = None,
        error: GeoServeError | None = None,
        by_kind: dict[str, ImageOutput] | None = None,
    ) -> TensorRequestOutput:
        """The outcome as a :class:`TensorRequestOutput` (the output's tensor)."""
        tensor = output.tensor if output is not None else None
        return TensorRequestOutput(
            self.request_id, True, tensor, error, self.num_patches, self.timings
        )


def tensor_patcher(proc: InputProcessor) -> GeoTiffPatcher:
    """The processor that cuts already-normalised tensors on ``proc``'s grid.

    The same patch size, stride and blend; every band, no scaling, no nodata: no value changes.
    """
    return GeoTiffPatcher(
        patch_size=proc.patch_size,
        stride=proc.stride,
        blend=proc.blend,  # type: ignore[arg-type]
    )


def tensor_procs(
    out_proc: OutputProcessor, model_out_proc: OutputProcessor
) -> tuple[OutputProcessor, ...]:
    """The output processor of tensor requests (warm-up, :meth:`Engine.transform`).

    One kind, a raster one (``out_proc``, else the model's own): its values are not used,
    only its hooks.
    """
    if getattr(out_proc, "kind", None) in (*VECTOR_KINDS, *TOKEN_KINDS):
        return (model_out_proc,)
    return (out_proc,)


def tensor_spec(
    i: int, tensor: torch.Tensor, request_id: str
) -> tuple[RequestSpec, Callable[..., Request]]:
    """Tensor ``i`` of :meth:`Engine.transform` as a normalised spec and its request's type.

    Its (C, T) axes are read as one raster of C x T bands.

    Raises:
        ConfigError: the tensor is not (C, H, W) or (C, T, H, W).
    """
    arr = tensor.detach().cpu().float().numpy()
    if arr.ndim not in (3, 4):
        shape = tuple(arr.shape)
        raise ConfigError(f"tensor {i} has shape {shape}; expected (C, H, W) or (C, T, H, W)")
    flat = RasterArray(arr.reshape(-1, *arr.shape[-2:]), name=f"<tensor {i}>")
    spec = RequestSpec([flat], request_id, out_format="tensor")
    return spec.normalised(), partial(TensorRequest, tensor_shape=tuple(arr.shape[:-2]))
