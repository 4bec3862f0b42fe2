"""TerraMind v1's token generator: inputs (and earlier outputs) -> logits of an output's tokens.

TerraMind generates a modality as a grid of discrete tokens (one per 16x16 pixels), which its
tokenizer's decoder turns into pixels. The generator is an encoder-decoder transformer:

- **encoder**: each raw-pixel input (S2L2A, S2L1C, S1GRD, S1RTC, DEM, RGB) is cut into patches
  and projected like the fine-tuning encoder's (:class:`PatchEmbedding`); outputs generated
  earlier in a chain enter as token embeddings (:class:`TokenEmbedding`). Every token gets its
  position and modality embedding; all of them are concatenated (no merging) and run through
  the encoder blocks and ``encoder_norm``.
- **decoder**: one query per token position of the output, the learned ``mask_token`` plus the
  output's position and modality embedding (the modality embedding is the encoder's where the
  output also conditions later ones); the context is ``decoder_proj_context`` of the encoder
  output plus the context tokens' own embeddings; each block is self-attention,
  cross-attention (``query_norm``/``context_norm``) and an MLP; ``decoder_norm``; logits from
  ``to_logits``, tied to the output's token embedding (vocabulary 15360; LULC 4375).

Outputs are generated in order and chained: output *k* is conditioned on the inputs and on
outputs 1..k-1, so every output but the last has a token embedding in the encoder.
TerraTorch's one-step ROAR decoding predicts all positions of an output in one pass, in a
shuffled order; a position's logits do not depend on that order, so :meth:`logits` returns
them in position order and needs no random state. Sampling is :mod:`.sampling`'s.

Token grids are h x w = H/16 x W/16 in row-major order for any H, W that are multiples of 16,
square or not; position tables (14x14 at 224 px) are resized bicubically to the grid.

Module and parameter names are those of TerraTorch's ``sampler.model`` in
``terramind_v1_<size>_generate`` (``encoder_embeddings.<key>``, ``decoder_embeddings.<key>``,
``encoder.<i>``, ``decoder.<i>.cross_attn.kv``, ...). Facts from TerraTorch 1.2.13 and the
TerraMind paper (arXiv:2504.11171).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from geoserve.errors import ConfigError, InputError
from geoserve.models.terramind.encoder import (
    Attention,
    Block,
    LayerNorm,
    Mlp,
    PatchEmbedding,
    resized_positions,
    sincos_2d,
)
from geoserve.models.terramind.variants import (
    IMG_SIZE,
    MODALITIES,
    PATCH_SIZE,
    VARIANTS,
    modality_key,
    modality_of_key,
)

#: Decoder depth of each variant (the encoder's is in ``VARIANTS``).
DECODER_DEPTH = {
    "terramind_v1_tiny": 4,
    "terramind_v1_small": 6,
    "terramind_v1_base": 12,
    "terramind_v1_large": 24,
}

#: The modalities TerraMind v1 generates: name -> (token key, vocabulary size).
OUTPUTS: dict[str, tuple[str, int]] = {
    "S2L2A": ("tok_sen2l2a@224", 15360),
    "S1GRD": ("tok_sen1grd@224", 15360),
    "S1RTC": ("tok_sen1rtc@224", 15360),
    "DEM": ("tok_dem@224", 15360),
    "LULC": ("tok_lulc@224", 4375),
    "NDVI": ("tok_ndvi@224", 15360),
}
_OUTPUT_BY_KEY = {key: name for name, (key, _) in OUTPUTS.items()}


def generator_args(variant: str) -> dict[str, Any]:
    """The architecture of ``tiny``, ``small``, ``base``, ``large`` (``terramind_v1_<size>``)."""
    name = variant if variant.startswith("terramind_v1_") else f"terramind_v1_{variant}"
    if name not in DECODER_DEPTH:
        known = ", ".join(n.removeprefix("terramind_v1_") for n in DECODER_DEPTH)
        raise ConfigError(f"unknown TerraMind v1 variant {variant!r}; known: {known}")
    return {**VARIANTS[name], "decoder_depth": DECODER_DEPTH[name]}


def output_name(name: str) -> str:
    """The canonical name of an output modality (``S2L2A``, ``s1grd``, ``tok_dem@224`` ...).

    Raises:
        ConfigError: TerraMind does not generate it (S2L1C and RGB are inputs only).
    """
    if name in _OUTPUT_BY_KEY:
        return _OUTPUT_BY_KEY[name]
    upper = name.upper().replace("SEN2", "S2").replace("SEN1", "S1")
    if upper in OUTPUTS:
        return upper
    known = ", ".join(OUTPUTS)
    raise ConfigError(f"TerraMind does not generate {name!r}; it generates {known}")


class TokenEmbedding(nn.Module):
    """A tokenized modality in the encoder: ``token_emb`` plus ``mod_emb`` and ``pos_emb``."""

    def __init__(self, vocab: int, dim: int, img_size: int = IMG_SIZE) -> None:
        super().__init__()
        self.vocab = vocab
        grid = img_size // PATCH_SIZE
        self.register_buffer("pos_emb", sincos_2d(grid, grid, dim))
        self.mod_emb = nn.Parameter(torch.zeros(1, 1, dim))
        self.token_emb = nn.Embedding(vocab, dim)

    def positions(self, h: int, w: int) -> torch.Tensor:
        """Position + modality embedding of an h x w grid, (1, h*w, D)."""
        return resized_positions(self.get_buffer("pos_emb"), h, w) + self.mod_emb

    def embed(self, ids: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids (B, h*w) -> their embeddings (B, N, D) and position + modality (1, N, D)."""
        return self.token_emb(ids), self.positions(h, w)


class OutputEmbedding(TokenEmbedding):
    """An output modality in the decoder: queries' embeddings and ``to_logits`` (tied)."""

    def __init__(self, vocab: int, dim: int, img_size: int = IMG_SIZE) -> None:
        super().__init__(vocab, dim, img_size)
        self.to_logits = nn.Linear(dim, vocab, bias=False)
        self.to_logits.weight = self.token_emb.weight


class CrossAttention(nn.Module):
    """Multi-head attention of queries (``q``) over a context (``kv``), then ``proj``."""

    def __init__(self, dim: int, num_heads: int, bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=bias)
        self.kv = nn.Linear(dim, dim * 2, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(B, N, D) queries, (B, M, D) context -> (B, N, D)."""
        b, n, d = x.shape
        m, heads = context.shape[1], self.num_heads
        q = self.q(x).reshape(b, n, heads, d // heads).transpose(1, 2)
        k, v = self.kv(context).reshape(b, m, 2, heads, d // heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: self-attention, cross-attention on the context, MLP."""

    def __init__(self, dim: int, num_heads: int, gated_mlp: bool, bias: bool) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim, bias=False)
        self.self_attn = Attention(dim, num_heads, bias)
        self.cross_attn = CrossAttention(dim, num_heads, bias)
        self.query_norm = LayerNorm(dim, bias=False)
        self.context_norm = LayerNorm(dim, bias=False)
        self.norm2 = LayerNorm(dim, bias=False)
        self.mlp = Mlp(dim, 4 * dim, gated_mlp, bias)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """One block."""
        x = x + self.self_attn(self.norm1(x))
        x = x + self.cross_attn(self.query_norm(x), self.context_norm(context))
        return x + self.mlp(self.norm2(x))


class TerraMindGenerator(nn.Module):
    """TerraMind v1's encoder-decoder for generating output modalities as tokens.

    Args:
        inputs: Raw-pixel input modalities (``S2L2A``, ``S2L1C``, ``S1GRD``, ``S1RTC``,
            ``DEM``, ``RGB``; TerraTorch's naming rules apply), in the model's order.
        outputs: Output modalities (``S2L2A``, ``S1GRD``, ``S1RTC``, ``DEM``, ``LULC``,
            ``NDVI``), in generation order; each is conditioned on those before it.
        dim, depth, decoder_depth, num_heads, gated_mlp, bias: The variant
            (:func:`generator_args`).
        img_size: The size the position tables are stored for (224 for v1).

    Raises:
        ConfigError: an unknown or tokenized input (LULC and NDVI need TerraMind's tokenizer
            encoder), an output TerraMind does not generate, or names given twice.
    """

    def __init__(
        self,
        inputs: Sequence[str],
        outputs: Sequence[str],
        *,
        dim: int,
        depth: int,
        decoder_depth: int,
        num_heads: int,
        gated_mlp: bool,
        bias: bool,
        img_size: int = IMG_SIZE,
    ) -> None:
        super().__init__()
        if not inputs or not outputs:
            raise ConfigError("a TerraMind generator needs at least one input and one output")
        try:
            self.input_keys = {name: modality_key(name) for name in inputs}
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        tokenized = [n for n, k in self.input_keys.items() if modality_of_key(k).tokenized]
        if tokenized:
            raw = ", ".join(m.name for m in MODALITIES.values() if not m.tokenized)
            raise ConfigError(
                f"inputs {tokenized} need TerraMind's tokenizer encoder; the generator takes "
                f"raw-pixel inputs ({raw})"
            )
        self.output_keys = {name: OUTPUTS[output_name(name)][0] for name in outputs}
        for label, keys in (("inputs", self.input_keys), ("outputs", self.output_keys)):
            if len(set(keys.values())) != len(keys):
                raise ConfigError(f"two {label} name one modality: {keys}")
        self.dim = dim
        embeddings: dict[str, nn.Module] = {
            key: PatchEmbedding(len(modality_of_key(key).bands), dim, img_size)
            for key in self.input_keys.values()
        }
        vocab = {OUTPUTS[output_name(n)][0]: OUTPUTS[output_name(n)][1] for n in outputs}
        chained = list(self.output_keys.values())[:-1]
        embeddings.update({key: TokenEmbedding(vocab[key], dim, img_size) for key in chained})
        self.encoder_embeddings = nn.ModuleDict(embeddings)
        self.decoder_embeddings = nn.ModuleDict(
            {key: OutputEmbedding(vocab[key], dim, img_size) for key in self.output_keys.values()}
        )
        for key in chained:  # one modality embedding per modality, as in pretraining
            self.decoder_embeddings[key].mod_emb = self.encoder_embeddings[key].mod_emb
        self.encoder = nn.ModuleList(Block(dim, num_heads, gated_mlp, bias) for _ in range(depth))
        self.encoder_norm = LayerNorm(dim, bias=False)
        self.decoder_proj_context = nn.Linear(dim, dim)
        self.decoder = nn.ModuleList(
            DecoderBlock(dim, num_heads, gated_mlp, bias) for _ in range(decoder_depth)
        )
        self.decoder_norm = LayerNorm(dim, bias=False)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))

    @property
    def inputs(self) -> list[str]:
        """The input modality names, in the model's order."""
        return list(self.input_keys)

    @property
    def outputs(self) -> list[str]:
        """The output modality names, in generation order."""
        return list(self.output_keys)

    def vocab_size(self, output: str) -> int:
        """The number of token ids of an output."""
        return int(self._decoder_embedding(self._output(output)).vocab)

    def token_grid(self, height: int, width: int) -> tuple[int, int]:
        """The h x w token grid of an H x W input (multiples of 16).

        Raises:
            InputError: a size that is not a positive multiple of 16.
        """
        if height <= 0 or width <= 0 or height % PATCH_SIZE or width % PATCH_SIZE:
            raise InputError(f"input size {height}x{width} is not a multiple of {PATCH_SIZE} px")
        return height // PATCH_SIZE, width // PATCH_SIZE

    def forward(
        self,
        inputs: Mapping[str, torch.Tensor],
        target: str,
        generated: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """:meth:`logits`."""
        return self.logits(inputs, target, generated)

    def logits(
        self,
        inputs: Mapping[str, torch.Tensor],
        target: str,
        generated: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One generation pass: the logits of every token position of ``target``.

        Args:
            inputs: Input name -> standardised (B, C, H, W) pixels, all on one H x W grid
                (any non-empty subset of the model's inputs).
            target: The output to predict.
            generated: Tokens of outputs generated before ``target`` (chaining), name ->
                (B, h, w) or (B, h*w) integer ids; TerraMind's own chain passes all of them.

        Returns:
            (B, h*w, V) float logits, positions in row-major order of the h x w grid.

        Raises:
            InputError: unknown or missing inputs, sizes that differ or are not multiples of
                16, tokens of an output not before ``target``, or malformed tokens.
        """
        target_key = self._output(target)
        batch, (h, w) = self._grid(inputs)
        parts = [self._embed_input(name, x) for name, x in self._given(inputs)]
        order = list(self.output_keys.values())
        earlier = order[: order.index(target_key)]
        conditions: dict[str, torch.Tensor] = {}
        for name, ids in (generated or {}).items():
            key = self._output(name)
            if key not in earlier:
                before = [_OUTPUT_BY_KEY[k] for k in earlier] or "none"
                raise InputError(
                    f"tokens of {name!r} cannot condition {target!r}: only outputs generated "
                    f"before it can ({before})"
                )
            conditions[key] = self._check_tokens(name, key, ids, batch, h, w)
        for key in earlier:  # in generation order, after the inputs
            if key in conditions:
                emb = self.encoder_embeddings[key]
                assert isinstance(emb, TokenEmbedding)
                parts.append(emb.embed(conditions[key], h, w))
        tokens = torch.cat([t for t, _ in parts], dim=1)
        embs = torch.cat([e.expand(batch, -1, -1) for _, e in parts], dim=1)
        x = tokens + embs
        for block in self.encoder:
            x = block(x)
        context = self.decoder_proj_context(self.encoder_norm(x)) + embs
        out = self._decoder_embedding(target_key)
        y = self.mask_token + out.positions(h, w).expand(batch, -1, -1)
        for dec in self.decoder:
            y = dec(y, context)
        return out.to_logits(self.decoder_norm(y))

    def _output(self, name: str) -> str:
        try:
            key = OUTPUTS[output_name(name)][0]
        except ConfigError as exc:
            raise InputError(str(exc)) from None
        if key not in self.output_keys.values():
            raise InputError(f"{name!r} is not an output of this model: {self.outputs}")
        return key

    def _decoder_embedding(self, key: str) -> OutputEmbedding:
        emb = self.decoder_embeddings[key]
        assert isinstance(emb, OutputEmbedding)
        return emb

    def _given(self, inputs: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        by_key: dict[str, tuple[str, torch.Tensor]] = {}
        own = set(self.input_keys.values())
        for name, x in inputs.items():
            try:
                key = modality_key(name)
            except ValueError:
                key = ""
            if key not in own:
                raise InputError(f"unknown input {name!r}; this model takes {self.inputs}")
            if key in by_key:
                raise InputError(f"inputs {by_key[key][0]!r} and {name!r} name one modality")
            by_key[key] = (name, x)
        if not by_key:
            raise InputError(f"no input; this model takes {self.inputs}")
        return [by_key[k] for k in self.input_keys.values() if k in by_key]

    def _grid(self, inputs: Mapping[str, torch.Tensor]) -> tuple[int, tuple[int, int]]:
        shapes = {name: tuple(x.shape) for name, x in inputs.items()}
        if not shapes:
            raise InputError(f"no input; this model takes {self.inputs}")
        first = next(iter(shapes.values()))
        for name, shape in shapes.items():
            if len(shape) != 4:
                raise InputError(f"input {name!r} has shape {shape}; expected (B, C, H, W)")
            if (shape[0], shape[2], shape[3]) != (first[0], first[2], first[3]):
                raise InputError(f"inputs differ in batch or size: {shapes}")
        return int(first[0]), self.token_grid(int(first[2]), int(first[3]))

    def _embed_input(self, name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = self.encoder_embeddings[modality_key(name)]
        assert isinstance(emb, PatchEmbedding)
        if x.shape[1] != emb.channels:
            raise InputError(f"input {name!r} has {x.shape[1]} bands; expected {emb.channels}")
        return emb.embed(x)

    def _check_tokens(
        self, name: str, key: str, ids: torch.Tensor, batch: int, h: int, w: int
    ) -> torch.Tensor:
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InputError(f"tokens of {name!r} must be integer ids, not {ids.dtype}")
        if tuple(ids.shape) not in ((batch, h, w), (batch, h * w)):
            raise InputError(
                f"tokens of {name!r} have shape {tuple(ids.shape)}; expected ({batch}, {h}, {w})"
            )
        vocab = self._decoder_embedding(key).vocab
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise InputError(f"tokens of {name!r} lie outside 0..{vocab - 1}")
        return ids.reshape(batch, h * w).long()
