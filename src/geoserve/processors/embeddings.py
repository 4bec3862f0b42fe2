"""The embeddings outputs: an encoder's patch tokens, from the same forward pass as its output.

A model whose encoder works on a grid of tokens (each ``t x t`` pixels: Prithvi, the demo
model) says so when it is registered (``register_model(..., token_size=16)``) and its module
provides::

    def forward_with_tokens(self, x, *, layer=-1, **model_kwargs):
        return output, tokens  # tokens: (B, D, P / t, P / t), the patch tokens of block
                               # ``layer`` (prefix tokens such as CLS dropped)

The engine calls it instead of ``forward`` for batches of requests that ask for an
embeddings kind, so every output kind of a request comes from one pass.

``embeddings``: the tokens are stitched on the **token grid** (the patch grid divided by
``t``: patch ``P / t``, stride ``S / t``, the same blend mode), so overlapping patches are
combined by the same rules as pixel outputs, and written as a GeoTIFF of D bands on the input's
CRS with transform ``input transform x scale(t)``, ``ceil(W / t) x ceil(H / t)`` tokens
covering the input. A token is nodata (NaN) where every input pixel under it is.

``patch-embeddings``: one row per patch, the mean of its tokens and the polygon of its core
(:mod:`geoserve.raster.patch_embeddings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from affine import Affine
from numpy.typing import NDArray

from geoserve.errors import ConfigError
from geoserve.processors.base import OutputProcessor, RasterContext
from geoserve.processors.reassemblers import float_output
from geoserve.raster.grid import PatchGrid
from geoserve.raster.write import OutputRaster
from geoserve.schemas import TOKEN_KINDS


@dataclass(frozen=True)
class EmbeddingReassembler(OutputProcessor):
    """Output processor of the ``embeddings`` and ``patch-embeddings`` kinds.

    Args:
        kind: ``embeddings`` (tokens on the token grid) or ``patch-embeddings``.
        layer: The encoder block whose tokens are taken (-1: the last).
        dtype: ``float32``, or ``float16``: stored as 16-bit half floats (GDAL's ``NBITS=16``
            on a float32 GeoTIFF, half the size; read back as float32).
    """

    kind: Literal["embeddings", "patch-embeddings"] = "embeddings"  # type: ignore[assignment]
    layer: int = -1
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.kind not in TOKEN_KINDS:
            raise ConfigError(
                f"EmbeddingReassembler makes {', '.join(TOKEN_KINDS)}, not {self.kind!r}"
            )
        if self.dtype not in ("float32", "float16"):
            raise ConfigError(f"embedding_dtype: {self.dtype!r}; choose float32 or float16")

    @property
    def kinds(self) -> tuple[str, ...]:
        """Both token kinds."""
        return TOKEN_KINDS

    def for_kind(self, kind: str) -> EmbeddingReassembler:
        """The other token kind."""
        return EmbeddingReassembler(kind, self.layer, self.dtype)  # type: ignore[arg-type]

    def finalize(
        self,
        blended: NDArray[np.float32],
        valid: NDArray[np.bool_] | None,
        ctx: RasterContext,
    ) -> OutputRaster:
        """Blended tokens (D, rows, W / t) as D float bands; NaN where the input is nodata."""
        names = [f"embedding_{i}" for i in range(blended.shape[0])]
        tags = {"GEOSERVE_OUTPUT": "embeddings", "EMBEDDING_LAYER": str(self.layer)}
        nbits = 16 if self.dtype == "float16" else None
        return float_output(blended.copy(), valid, ctx.has_nodata, names, tags, nbits)


def check_token_tiling(grid: PatchGrid, token: int) -> None:
    """Refuse a tiling whose patches do not start and end on token edges.

    Raises:
        ConfigError: naming patch size, stride and token size.
    """
    if grid.patch_size % token or grid.stride % token or grid.margin % token:
        raise ConfigError(
            f"embeddings need patches on token edges: patch_size ({grid.patch_size}), stride "
            f"({grid.stride}) and their margin ((patch_size - stride) / 2 = {grid.margin}) must "
            f"be multiples of the model's token size ({token}); choose --patch-size and "
            "--stride to fit"
        )


def token_grid(grid: PatchGrid, token: int) -> PatchGrid:
    """The patch grid on tokens: every length divided by ``token`` (image sizes rounded up).

    Raises:
        ConfigError: the tiling does not fall on token edges (:func:`check_token_tiling`).
    """
    check_token_tiling(grid, token)
    return PatchGrid(
        math.ceil(grid.height / token),
        math.ceil(grid.width / token),
        grid.patch_size // token,
        grid.stride // token,
        grid.blend,
    )


def token_valid(valid: NDArray[np.bool_] | None, token: int) -> NDArray[np.bool_] | None:
    """A pixel validity mask (H, W) on tokens: a token is valid where any pixel under it is."""
    if valid is None:
        return None
    h, w = valid.shape
    th, tw = math.ceil(h / token), math.ceil(w / token)
    padded = np.zeros((th * token, tw * token), dtype=bool)
    padded[:h, :w] = valid
    out = padded.reshape(th, token, tw, token).any(axis=(1, 3))
    return np.asarray(out, dtype=bool)


def token_profile(profile: Any, grid: PatchGrid, token: int) -> dict[str, Any]:
    """The input's profile on the token grid: transform scaled by ``token``, token counts."""
    out = dict(profile)
    transform = out.get("transform")
    if transform is not None:
        out["transform"] = transform @ Affine.scale(token)
    out["width"], out["height"] = math.ceil(grid.width / token), math.ceil(grid.height / token)
    return out
