"""Loading TerraMind v1 generator weights from the published checkpoints or TerraTorch's models.

Two layouts hold a generator's weights:

- **the pretrained checkpoint** (``TerraMind_v1_<size>.pt``, the file TerraTorch's
  ``terramind_v1_<size>_generate(pretrained=True)`` loads): bare names (``encoder.0...``,
  ``encoder_embeddings.<key>``, ``decoder_embeddings.<key>``, ``decoder.0...``,
  ``mask_token``) for every modality of pretraining;
- **a TerraTorch ``TerraMindGeneration`` state dict**: the same names under
  ``sampler.model.``, beside its tokenizers' (``tokenizer.*``, not the generator's).

As TerraTorch maps them, the generator's own names are taken and everything else (other
modalities, tokenizers) is dropped. Unlike TerraTorch, which fills what is missing or mis-shaped
with random weights, loading is strict: only the fixed buffers (sin-cos position tables, the
LayerNorms' zero biases) and the tied copies of a tensor that is present (``to_logits`` /
``token_emb``, a modality embedding shared by encoder and decoder) are taken from the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from geoserve.errors import WeightsError
from geoserve.models.hub import resolve_weights
from geoserve.models.state_dict import check_matches, load_strict, read_state_dict
from geoserve.models.terramind.generation import TerraMindGenerator, generator_args
from geoserve.models.terramind.tokenizers import VQVAE, DiVAE
from geoserve.models.terramind.tokenizers.builders import load_tokenizer, tokenizer_spec
from geoserve.models.terramind.variants import VARIANTS

#: TerraTorch's prefix of the generator inside ``TerraMindGeneration``.
PREFIX = "sampler.model."
_BY_DIM = {v["dim"]: name for name, v in VARIANTS.items()}


def generator_state(
    state: Mapping[str, torch.Tensor], model: TerraMindGenerator
) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under ``model``'s names (not checked: see :func:`load_generator`)."""
    if any(k.startswith(PREFIX) for k in state):
        state = {k[len(PREFIX) :]: v for k, v in state.items() if k.startswith(PREFIX)}
    own = model.state_dict()
    out = {k: v for k, v in state.items() if k in own}
    for key in model.decoder_embeddings:
        dec = f"decoder_embeddings.{key}."
        _tie(out, dec + "to_logits.weight", dec + "token_emb.weight")
        if key in model.encoder_embeddings:
            _tie(out, dec + "mod_emb", f"encoder_embeddings.{key}.mod_emb")
    for name, buffer in model.named_buffers():
        out.setdefault(name, buffer)
    return out


def _tie(state: dict[str, torch.Tensor], a: str, b: str) -> None:
    """Two names of one tensor: either present gives the other."""
    if a in state:
        state.setdefault(b, state[a])
    elif b in state:
        state[a] = state[b]


def load_generator(
    path: str | Path,
    inputs: Sequence[str],
    outputs: Sequence[str],
    variant: str | None = None,
) -> TerraMindGenerator:
    """The generator for ``inputs`` -> ``outputs`` with a checkpoint's weights, loaded strictly.

    Args:
        path: A ``.pt``/``.safetensors`` file in either layout (see the module docstring).
        inputs: The raw-pixel input modalities (see :class:`TerraMindGenerator`).
        outputs: The output modalities, in generation order.
        variant: ``tiny``, ``small``, ``base`` or ``large``; read off the weights' width when
            not given.

    Raises:
        WeightsError: an unreadable file, no TerraMind generator weights in it, or weights
            that do not fit (missing, mis-shaped).
        ConfigError: an unknown variant or modality.
    """
    state = read_state_dict(path)
    if variant is None:
        token = state.get("mask_token", state.get(PREFIX + "mask_token"))
        if token is None:
            raise WeightsError(f"{path}: no TerraMind generator weights (no mask_token)")
        dim = int(token.shape[-1])
        if dim not in _BY_DIM:
            raise WeightsError(f"{path}: width {dim} is no TerraMind v1 variant; name one")
        variant = _BY_DIM[dim]
    args = generator_args(variant)
    with torch.device("meta"):  # names and shapes checked before any memory is spent
        probe = TerraMindGenerator(inputs, outputs, **args)
    source = f"{path} ({variant.removeprefix('terramind_v1_')} generator)"
    check_matches(probe.state_dict(), generator_state(state, probe), source)
    model = TerraMindGenerator(inputs, outputs, **args)
    load_strict(model, generator_state(state, model), source)
    return model.eval()


def published_generator(variant: str) -> str:
    """The Hub reference of a variant's pretrained weights (``tiny`` ... ``large``)."""
    size = variant.removeprefix("terramind_v1_")
    return f"hf://ibm-esa-geospatial/TerraMind-1.0-{size}/TerraMind_v1_{size}.pt"


class GenerationFiles:
    """Where a TerraMind generation model's weights are, for :class:`~.generate.TerraMindGenerate`.

    ``weights`` is one of:

    - ``None``: the published checkpoints on the Hugging Face Hub (the variant's
      ``TerraMind_v1_<size>.pt`` and ``TerraMind_Tokenizer_<MODALITY>.pt`` for each generated
      modality), fetched or read from the Hub cache (:mod:`geoserve.models.hub`);
    - a directory holding those files under those names;
    - one file: a TerraTorch ``TerraMindGeneration`` state dict (``sampler.model.*`` and
      ``tokenizer.<key>.*``).

    Only the tokenizers' decoder side is loaded (generated modalities are never inputs).

    Raises (from :meth:`generator` and :meth:`tokenizer`):
        WeightsError: a file that is missing (naming it and the file expected), unreadable
            or does not fit.
    """

    def __init__(self, variant: str, weights: str | Path | None = None) -> None:
        generator_args(variant)  # (refuses an unknown variant)
        self.variant = variant.removeprefix("terramind_v1_")
        self.weights = None if weights is None else Path(weights)

    def _file(self, name: str, reference: str) -> Path:
        if self.weights is None:
            path = resolve_weights(reference)
            assert path is not None
            return path
        path = self.weights / name
        if not path.is_file():
            raise WeightsError(
                f"{self.weights}: no {name} in it (a TerraMind generation model's weights "
                f"directory holds the generator's and each generated modality's tokenizer's "
                f"published checkpoints; this one is {reference})"
            )
        return path

    def generator(self, inputs: Sequence[str], outputs: Sequence[str]) -> TerraMindGenerator:
        """The token generator, loaded strictly (:func:`load_generator`)."""
        if self.weights is not None and self.weights.is_file():
            return load_generator(self.weights, inputs, outputs, self.variant)
        reference = published_generator(self.variant)
        path = self._file(reference.rsplit("/", 1)[1], reference)
        return load_generator(path, inputs, outputs, self.variant)

    def tokenizer(self, modality: str) -> DiVAE | VQVAE:
        """A generated modality's tokenizer, decoder side only (:func:`load_tokenizer`)."""
        spec = tokenizer_spec(modality)
        if self.weights is not None and self.weights.is_file():
            prefix = f"tokenizer.{spec.key}."
            return load_tokenizer(self.weights, spec.modality, encoder=False, prefix=prefix)
        path = self._file(spec.weights.rsplit("/", 1)[1], spec.weights)
        return load_tokenizer(path, spec.modality, encoder=False)
