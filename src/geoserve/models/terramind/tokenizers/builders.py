"""TerraMind v1's tokenizers per modality: their sizes, published weights, builders, loader.

| modality | kind | channels | FSQ levels | tokens |
| --- | --- | --- | --- | --- |
| S2L2A | DiVAE | 12 | 8-8-8-6-5 | 15360 |
| S1GRD, S1RTC | DiVAE | 2 | 8-8-8-6-5 | 15360 |
| DEM, NDVI | DiVAE | 1 | 8-8-8-6-5 | 15360 |
| LULC | VQVAE | 10 (class logits) | 7-5-5-5-5 | 4375 |

Every tokenizer has the ViT-B encoder; a DiVAE the full-size patched UNet (about 197 M
parameters), the VQVAE a ViT-B decoder. The published checkpoints
(``ibm-esa-geospatial/TerraMind-1.0-Tokenizer-<MODALITY>``, ``TerraMind_Tokenizer_<MODALITY>.pt``
on the Hugging Face Hub) hold exactly the tokenizer's state dict, no prefix:
:func:`load_tokenizer` reads one (through :mod:`geoserve.models.state_dict`), builds the
tokenizer on the meta device and assigns the tensors strictly, so missing, unexpected or
mis-shaped tensors are a :class:`~geoserve.errors.WeightsError` naming them. Facts from
TerraTorch 1.2.13 (``tokenizer_register.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from geoserve.errors import UnknownNameError, WeightsError
from geoserve.models.state_dict import load_strict, read_state_dict
from geoserve.models.terramind.tokenizers.autoencoders import VQVAE, DiVAE

#: Checkpoint prefixes of the encoder side, dropped when a tokenizer is built without it.
ENCODER_PREFIXES = ("encoder.", "quant_proj.")


@dataclass(frozen=True)
class TokenizerSpec:
    """One modality's tokenizer: its kind, size and published weights."""

    modality: str  # TerraTorch's name (S2L2A, S1GRD, ...)
    key: str  # TerraMind's token key (tok_sen2l2a@224, ...)
    kind: Literal["divae", "vqvae"]
    channels: int
    levels: tuple[int, ...]

    @property
    def vocabulary(self) -> int:
        """How many token values there are (the product of the FSQ levels)."""
        return math.prod(self.levels)

    @property
    def weights(self) -> str:
        """The published checkpoint, as a Hub reference (:mod:`geoserve.models.hub`)."""
        repo = f"ibm-esa-geospatial/TerraMind-1.0-Tokenizer-{self.modality}"
        return f"hf://{repo}/TerraMind_Tokenizer_{self.modality}.pt"


_IMAGE_LEVELS = (8, 8, 8, 6, 5)
TOKENIZERS: dict[str, TokenizerSpec] = {
    s.modality: s
    for s in (
        TokenizerSpec("S2L2A", "tok_sen2l2a@224", "divae", 12, _IMAGE_LEVELS),
        TokenizerSpec("S1GRD", "tok_sen1grd@224", "divae", 2, _IMAGE_LEVELS),
        TokenizerSpec("S1RTC", "tok_sen1rtc@224", "divae", 2, _IMAGE_LEVELS),
        TokenizerSpec("DEM", "tok_dem@224", "divae", 1, _IMAGE_LEVELS),
        TokenizerSpec("NDVI", "tok_ndvi@224", "divae", 1, _IMAGE_LEVELS),
        TokenizerSpec("LULC", "tok_lulc@224", "vqvae", 10, (7, 5, 5, 5, 5)),
    )
}
_BY_KEY = {s.key: s for s in TOKENIZERS.values()}


def tokenizer_spec(name: str) -> TokenizerSpec:
    """The tokenizer of a modality, by name (any case) or token key (``tok_dem@224``).

    Raises:
        UnknownNameError: no TerraMind v1 tokenizer has this name.
    """
    spec = _BY_KEY.get(name) or TOKENIZERS.get(name.upper())
    if spec is None:
        raise UnknownNameError("TerraMind tokenizer", name, TOKENIZERS)
    return spec


def build_tokenizer(name: str, *, encoder: bool = True) -> DiVAE | VQVAE:
    """The full-size tokenizer of a modality, randomly initialised.

    Build it inside ``torch.device("meta")`` to see names and shapes without memory.
    ``encoder=False``: the decoder side only (tokens -> image).
    """
    spec = tokenizer_spec(name)
    if spec.kind == "divae":
        return DiVAE(spec.channels, spec.levels, encoder=encoder)
    return VQVAE(spec.channels, spec.levels, encoder=encoder)


def tokenizer_state(
    state: Mapping[str, torch.Tensor],
    path: str | Path,
    *,
    encoder: bool = True,
    prefix: str = "",
) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the tokenizer's own names.

    ``prefix``: the tokenizer's tensors sit under it (e.g. ``tokenizer.tok_dem@224.`` in a
    whole generation model's state dict); other keys are ignored. ``encoder=False`` drops the
    encoder side (:data:`ENCODER_PREFIXES`).

    Raises:
        WeightsError: nothing under ``prefix``.
    """
    if prefix:
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if not state:
            raise WeightsError(f"{path}: no tensors under {prefix!r}")
    if not encoder:
        return {k: v for k, v in state.items() if not k.startswith(ENCODER_PREFIXES)}
    return dict(state)


def load_tokenizer(
    path: str | Path, name: str, *, encoder: bool = True, prefix: str = ""
) -> DiVAE | VQVAE:
    """A modality's tokenizer with a checkpoint's weights, strictly (float32, CPU, eval mode).

    ``path``: a local file (resolve a Hub reference with :mod:`geoserve.models.hub` first).
    ``encoder=False`` builds and loads the decoder side only, skipping the encoder tensors.

    Raises:
        UnknownNameError: an unknown modality.
        WeightsError: an unreadable file, or tensors missing, unexpected or mis-shaped.
    """
    spec = tokenizer_spec(name)
    label = f"TerraMind {spec.modality} tokenizer"
    state = read_state_dict(path, model_name=label)
    state = tokenizer_state(state, path, encoder=encoder, prefix=prefix)
    with torch.device("meta"):
        model = build_tokenizer(spec.modality, encoder=encoder)
    load_strict(model, state, path, assign=True, model_name=label)
    return model.eval()
