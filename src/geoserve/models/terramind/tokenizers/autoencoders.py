"""TerraMind's two tokenizer kinds: :class:`DiVAE` (diffusion decoder) and :class:`VQVAE`.

Both share the encoder side: the ViT-B :class:`~.vit.TokenizerEncoder`, a 1 x 1 convolution
to the FSQ latent (``quant_proj``, 768 -> 5) and the quantiser (:class:`~.fsq.FSQ`); tokens are
a ``(B, H/16, W/16)`` grid of indices. The encoder is only needed when a tokenized modality is
an *input*; built with ``encoder=False`` a tokenizer holds the decoder side alone (and its
loader skips the checkpoint's encoder tensors).

- :class:`DiVAE` (S2L2A, S1GRD, S1RTC, DEM, NDVI): the codes condition the patched UNet
  (:class:`~.unet.PatchedUNet`, ``decoder``), which denoises an image from the caller's
  Gaussian noise over the DDIM schedule (:class:`~.ddim.DDIM`). :meth:`DiVAE.predict` is one
  UNet call and ``scheduler.step`` one update, for an engine that interleaves steps;
  :meth:`DiVAE.decode_tokens` runs the whole chain. Output in standardised units, in
  ``[-1, 1]``.
- :class:`VQVAE` (LULC): the codes go through a 1 x 1 convolution (``post_quant_proj``,
  5 -> 768) and the ViT-B :class:`~.vit.TokenizerDecoder` to per-pixel class logits (10
  channels for v1), no argmax.

Module names are the published checkpoints' (``encoder.*``, ``quant_proj.*``,
``post_quant_proj.*``, ``decoder.*``). Facts from TerraTorch 1.2.13 (``tokenizer/vqvae.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from geoserve.models.terramind.tokenizers.ddim import DDIM, DEFAULT_STEPS
from geoserve.models.terramind.tokenizers.fsq import FSQ
from geoserve.models.terramind.tokenizers.unet import PatchedUNet
from geoserve.models.terramind.tokenizers.vit import PATCH, TokenizerDecoder, TokenizerEncoder


class _Tokenizer(nn.Module):
    """The encoder side (optional) and the quantiser."""

    def __init__(
        self,
        channels: int,
        levels: Sequence[int],
        encoder: bool,
        vit: Mapping[str, Any] | None,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.quantize = FSQ(levels)
        self.encoder: TokenizerEncoder | None = None
        self.quant_proj: nn.Conv2d | None = None
        if encoder:
            self.encoder = TokenizerEncoder(channels, **(vit or {}))
            self.quant_proj = nn.Conv2d(self.encoder.dim, self.quantize.dim, 1)

    @property
    def patch_size(self) -> int:
        """Pixels per token side."""
        return PATCH

    def tokenize(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` standardised input (a class map for LULC) -> ``(B, H/16, W/16)`` tokens.

        Raises:
            ValueError: built without the encoder, or an input of the wrong shape.
        """
        if self.encoder is None or self.quant_proj is None:
            raise ValueError("this tokenizer was built without its encoder (encoder=False)")
        features = self.encoder(x)
        latent = self.quant_proj(features.to(self.quant_proj.weight.dtype))
        return self.quantize(latent.float())[1]

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.ndim != 3:
            raise ValueError(f"tokens must be a (B, h, w) grid, got shape {tuple(tokens.shape)}")


class DiVAE(_Tokenizer):
    """Diffusion tokenizer: tokens -> image by DDIM over a code-conditioned UNet."""

    def __init__(
        self,
        channels: int,
        levels: Sequence[int] = (8, 8, 8, 6, 5),
        *,
        encoder: bool = True,
        vit: Mapping[str, Any] | None = None,
        unet: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(channels, levels, encoder, vit)
        self.decoder = PatchedUNet(channels, cond_channels=self.quantize.dim, **(unet or {}))
        self.scheduler = DDIM()

    @property
    def multiple(self) -> int:
        """Image sides the decoder takes are multiples of this (32)."""
        return self.decoder.multiple

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, h, w)`` tokens -> ``(B, 5, h, w)`` codes, the UNet's conditioning."""
        self._check_tokens(tokens)
        return self.quantize.embed(tokens)

    def predict(
        self, x_t: torch.Tensor, t: int | torch.Tensor, codes: torch.Tensor
    ) -> torch.Tensor:
        """One UNet call: the clean image predicted from ``x_t`` at ``t`` (int or ``(B,)``)."""
        return self.decoder(x_t, t, codes)

    @torch.no_grad()
    def decode_tokens(
        self, tokens: torch.Tensor, noise: torch.Tensor, steps: int = DEFAULT_STEPS
    ) -> torch.Tensor:
        """Tokens -> image, denoising ``noise`` over ``steps`` DDIM steps (float32, no grad).

        ``noise``: the initial sample, ``(B, C, 16 h, 16 w)`` for ``(B, h, w)`` tokens, drawn
        by the caller (standard normal). ``steps`` follows TerraTorch's integer spacing
        (:meth:`DDIM.timesteps`): ``steps=3`` runs 4 UNet calls.

        Raises:
            ValueError: tokens, noise or steps that do not fit.
        """
        self._check_tokens(tokens)
        b, h, w = tokens.shape
        want = (b, self.channels, h * PATCH, w * PATCH)
        if tuple(noise.shape) != want:
            raise ValueError(
                f"noise must be {want} for tokens {tuple(tokens.shape)}, got {tuple(noise.shape)}"
            )
        schedule = self.scheduler.schedule(steps)
        codes = self.embed(tokens.to(noise.device))
        x = noise.float()
        for t, t_prev in schedule:
            x = self.scheduler.step(x, self.predict(x, t, codes), t, t_prev)
        return x


class VQVAE(_Tokenizer):
    """Tokenizer with a ViT decoder: tokens -> per-pixel values (LULC class logits)."""

    def __init__(
        self,
        channels: int,
        levels: Sequence[int] = (7, 5, 5, 5, 5),
        *,
        encoder: bool = True,
        vit: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(channels, levels, encoder, vit)
        self.decoder = TokenizerDecoder(channels, **(vit or {}))
        self.post_quant_proj = nn.Conv2d(self.quantize.dim, self.decoder.dim, 1)

    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, h, w)`` tokens -> ``(B, C, 16 h, 16 w)`` values (logits for LULC)."""
        self._check_tokens(tokens)
        weight = self.post_quant_proj.weight
        codes = self.quantize.embed(tokens.to(weight.device)).to(weight.dtype)
        return self.decoder(self.post_quant_proj(codes))
