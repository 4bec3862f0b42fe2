"""TerraMind "Thinking in Modalities" (TiM): the backbone of ``terramind_v1_<size>_tim`` fine-tunes.

A TiM backbone (TerraTorch's ``TerraMindTiM``) first generates the tokens of one or more
modalities it was not given (LULC by default) with TerraMind's pretrained generator, from the
raw inputs, then runs its encoder on the inputs plus those tokens. Per batch:

1. **generation** (no gradients): for each TiM modality in order, one pass of the generator
   (:class:`~geoserve.models.terramind.generation.TerraMindGenerator`, TerraTorch's
   ``sampler.model``) gives the logits of all of its token positions — TerraTorch's one-step
   ROAR decoding — and a token is chosen per position (:func:`~.sampling.sample_tokens`). With
   chained generation (the default) each generated modality conditions the ones after it.
2. **encoding**: the inputs' patch embeddings and the generated tokens' embeddings (token,
   position and modality embedding) are concatenated, run through the encoder's blocks, and
   every layer's output is split per modality and merged as a TerraMind fine-tune's
   (:class:`~geoserve.models.terramind.encoder.TerraMindEncoder`): the generated modalities
   count as image modalities, so ``mean`` averages over inputs and generated modalities alike
   and ``concat`` holds one slot per input and per generated modality.

The necks, decoder and head that follow are a TerraMind fine-tune's
(:class:`~geoserve.models.terramind.segmentation.TerraMindSegmentation`).

**Sampling.** At temperature 0 the most likely token is taken: the tokens, and so the features,
are TerraTorch's. TerraTorch's default is temperature 1 with nucleus (top-p) 0.8, each call
drawing from ``torch.multinomial`` after reseeding torch's global generator with a fresh random
seed, so its own output changes from call to call. geoserve draws from the same filtered
distribution, but with fixed numbers: the token at position *i* of the grid is the inverse of
the cumulative distribution at uniform number *i* of a fixed sequence (one per TiM modality).
The same patch always gives the same tokens, whatever else is in its batch, on any device or
process; the tokens are distributed as TerraTorch's, but not the ones it would draw.

**Weights.** Names are those of TerraTorch's ``TerraMindTiM`` (a fine-tune checkpoint holds
them under ``model.encoder.``): ``encoder_embeddings.<key>`` (the inputs' ``untok_*`` patch
embeddings and the TiM modalities' ``tok_*`` token embeddings), ``encoder.<i>``,
``encoder_norm``, and the generator's under ``sampler.model.``. With chained generation the
generator's encoder embeddings *are* the backbone's (one module under both names, as in
TerraTorch, whose checkpoints hold both names) and a generated modality's decoder modality
embedding is its encoder one. The TiM modalities' tokenizers (``tokenizer.*``) decode nothing
here and are not loaded. Facts from TerraTorch 1.2.13 (``terramind_tim.py``,
``terramind_register.py``).

Unlike TerraTorch, the token grid need not be square (TerraTorch's token embedding asserts a
square one; positions are resized bicubically as for the inputs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from geoserve.models.terramind.encoder import TerraMindEncoder
from geoserve.models.terramind.generation import OUTPUTS, TerraMindGenerator, TokenEmbedding
from geoserve.models.terramind.sampling import ZERO_TEMPERATURE, sample_tokens
from geoserve.models.terramind.tim_config import TiMOptions
from geoserve.models.terramind.variants import IMG_SIZE, modality_key, modality_of_key

#: Seed of the fixed uniform numbers tokens are drawn with (TiM modality k: this + k).
UNIFORM_SEED = 20250417


class Sampler(nn.Module):
    """Holds the generator as ``model`` (TerraTorch's ``GenerationSampler`` names)."""

    def __init__(self, model: TerraMindGenerator) -> None:
        super().__init__()
        self.model = model


class TerraMindTiMEncoder(TerraMindEncoder):
    """A TiM backbone: raw modalities -> generated TiM tokens -> merged features per layer.

    Args:
        modalities: The raw-pixel input modalities (``S2L2A``, ``S2L1C``, ``S1GRD``,
            ``S1RTC``, ``DEM``, ``RGB``), all of each one's pretrained bands, in the model's
            order.
        tim: What is generated and how (:class:`~.tim_config.TiMOptions`).
        dim, depth, num_heads, gated_mlp, bias: The variant (``VARIANTS``).
        decoder_depth: The generator's decoder depth (``generation.DECODER_DEPTH``).
        merge: ``mean``, ``max`` or ``concat`` (see the module docstring).
        img_size: The size the position tables are stored for (224 for v1).

    Raises:
        ConfigError: an input the generator does not take (a tokenized one), a TiM modality
            that is not generated, or names given twice.
        ValueError: an unknown merge method.
    """

    def __init__(
        self,
        modalities: Sequence[str],
        tim: TiMOptions,
        *,
        dim: int,
        depth: int,
        decoder_depth: int,
        num_heads: int,
        gated_mlp: bool,
        bias: bool,
        merge: str = "mean",
        img_size: int = IMG_SIZE,
    ) -> None:
        generator = TerraMindGenerator(
            modalities,
            tim.modalities,
            dim=dim,
            depth=depth,
            decoder_depth=decoder_depth,
            num_heads=num_heads,
            gated_mlp=gated_mlp,
            bias=bias,
            img_size=img_size,
        )  # (checks the names first)
        channels = {m: len(modality_of_key(modality_key(m)).bands) for m in modalities}
        super().__init__(
            channels,
            dim=dim,
            depth=depth,
            num_heads=num_heads,
            gated_mlp=gated_mlp,
            bias=bias,
            merge=merge,
            img_size=img_size,
        )
        self.tim = tim
        self.tim_keys = {name: OUTPUTS[name][0] for name in tim.modalities}
        encoder_side, decoder_side = generator.encoder_embeddings, generator.decoder_embeddings
        for name, key in self.tim_keys.items():
            if tim.chained:  # every TiM modality is also a generator input
                if key not in encoder_side:
                    encoder_side[key] = TokenEmbedding(OUTPUTS[name][1], dim, img_size)
                decoder_side[key].mod_emb = encoder_side[key].mod_emb
                self.encoder_embeddings[key] = encoder_side[key]
            else:  # the generator sees the inputs only; the backbone embeds the tokens
                if key in encoder_side:
                    del encoder_side[key]
                decoder_side[key].mod_emb = nn.Parameter(torch.zeros(1, 1, dim))
                self.encoder_embeddings[key] = TokenEmbedding(OUTPUTS[name][1], dim, img_size)
        if tim.chained:  # one module under both names
            for key in self.keys.values():
                self.encoder_embeddings[key] = encoder_side[key]
        self.sampler = Sampler(generator)
        self.slots = len(self.keys) + len(self.tim_keys)
        width = dim * self.slots if merge == "concat" else dim
        self.out_channels = [width] * depth

    @property
    def generator(self) -> TerraMindGenerator:
        """The token generator (``sampler.model``)."""
        return self.sampler.model

    def forward(self, x: Mapping[str, torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
        """Per-layer merged features of the inputs and the TiM modalities generated from them.

        ``x`` maps input names to standardised (B, C, H, W) tensors on one grid, H and W
        multiples of 16 (any non-empty subset of the inputs; a bare tensor is the first).
        """
        x = self.given(x)
        tokens = self.generate(x)
        seqs = [self.encoder_embeddings[self.keys[m]](t) for m, t in x.items()]
        for name, ids in tokens.items():
            emb = self.encoder_embeddings[self.tim_keys[name]]
            assert isinstance(emb, TokenEmbedding)
            h, w = ids.shape[-2:]
            values, embedding = emb.embed(ids.reshape(ids.shape[0], -1), h, w)
            seqs.append(values + embedding)
        return self.encode(seqs)

    @torch.no_grad()
    def generate(self, x: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tokens of each TiM modality, name -> (B, H/16, W/16) int64 ids, in order.

        Raises:
            InputError: inputs the generator cannot take (sizes, bands).
        """
        gen = self.generator
        first = next(iter(x.values()))
        batch, (h, w) = first.shape[0], gen.token_grid(*first.shape[-2:])
        t = self.tim
        argmax = abs(t.temperature) <= ZERO_TEMPERATURE
        out: dict[str, torch.Tensor] = {}
        for index, name in enumerate(self.tim_keys):
            logits = gen.logits(x, name, out if t.chained else None)
            u = None if argmax else uniforms(index, batch, h * w, logits.device)
            ids = sample_tokens(logits, t.temperature, t.top_p, t.top_k, u)
            out[name] = ids.reshape(batch, h, w)
        return out


def uniforms(index: int, batch: int, n: int, device: torch.device | str) -> torch.Tensor:
    """TiM modality ``index``'s fixed numbers in [0, 1) for an n-token grid, (batch, n) float64.

    The same for every patch and every item of a batch, on any device (drawn on the CPU).
    """
    g = torch.Generator().manual_seed(UNIFORM_SEED + index)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    return u.to(device).unsqueeze(0).expand(batch, n)
