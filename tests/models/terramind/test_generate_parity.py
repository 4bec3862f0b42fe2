"""The served generation model end to end against TerraTorch 1.2.13's ``TerraMindGeneration``:
one 64 px chip, S2L2A -> S1GRD (2 denoising steps) and LULC, temperature 0, random weights at
toy width (TerraTorch's own classes: its generator, a narrow patched UNet, a shallow ViT
decoder).

TerraTorch draws the diffusion's initial noise from torch's global generator; here that one
call is handed the noise geoserve's model draws for the chip from its scene-keyed field, so both
start from the same noise and must agree to float rounding.
"""

from __future__ import annotations

import pytest
import torch

from geoserve.models.state_dict import load_strict
from geoserve.models.steps import noise_field
from geoserve.models.terramind.generate import GENERATED, GenerationOptions, TerraMindGenerate
from geoserve.models.terramind.generation import TerraMindGenerator, generator_args
from geoserve.models.terramind.generation_weights import generator_state
from geoserve.models.terramind.tokenizers import VQVAE, DiVAE
from geoserve.models.terramind.variants import MODALITIES
from tests.models.terramind import reference
from tests.models.terramind.test_generation_parity import _randomise
from tests.models.terramind.test_tokenizer_parity import (
    SMALL_UNET,
    SMALL_VIT,
    _ref_unet,
    _small_ref_vq,
)
from tests.models.terramind.test_tokenizer_parity import _randomise as _randomise_tokenizer

TOL = 1e-4
SEED = 5


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, TerraMindGenerate]:
    torch.manual_seed(0)
    ref = reference.generation(
        "tiny", modalities=["S2L2A"], output_modalities=["S1GRD", "LULC"], temps=0.0, timesteps=2
    )
    _randomise(ref, 0)
    s1 = reference.tokenizer("s1grd")
    s1.decoder = _ref_unet(2)
    lulc = reference.tokenizer("lulc")
    _small_ref_vq(lulc, 10, decoder=True)
    _randomise_tokenizer(lulc, 1)
    ref.tokenizer["tok_sen1grd@224"] = s1.eval()
    ref.tokenizer["tok_lulc@224"] = lulc.eval()
    ref.eval()

    generator = TerraMindGenerator(["S2L2A"], ["S1GRD", "LULC"], **generator_args("tiny"))
    load_strict(generator, generator_state(ref.state_dict(), generator), "TerraTorch's")
    divae = DiVAE(2, encoder=False, unet=SMALL_UNET)
    divae.decoder.load_state_dict(s1.decoder.state_dict(), strict=True)
    vq = VQVAE(10, encoder=False, vit=SMALL_VIT)
    theirs = {
        k: v for k, v in lulc.state_dict().items() if not k.startswith(("encoder.", "quant_proj."))
    }
    vq.load_state_dict(theirs, strict=True)
    options = GenerationOptions(steps=2, temperature=0.0)
    ours = TerraMindGenerate.from_parts(
        generator.eval(), {"S1GRD": divae.eval(), "LULC": vq.eval()}, options
    )
    return ref, ours


def test_a_chip_generates_as_terratorch_from_the_same_noise(pair, monkeypatch) -> None:
    ref, ours = pair
    x = torch.randn(1, 12, 64, 64, generator=torch.Generator().manual_seed(3))
    stream = 200 + GENERATED.index("S1GRD")  # the diffusion noise field of S1GRD
    noise = noise_field(SEED, stream, (0, 0), (2, 64, 64)).unsqueeze(0)
    randn = torch.randn

    def same_noise(*args, **kwargs):  # TerraTorch's PipelineCond: torch.randn((B, C, H, W))
        size = args[0] if len(args) == 1 and isinstance(args[0], tuple) else args
        if tuple(size) == (1, 2, 64, 64):
            return noise.clone()
        return randn(*args, **kwargs)

    with torch.no_grad():
        monkeypatch.setattr(torch, "randn", same_noise)
        want = ref({"S2L2A": x.clone()}, standardize=False)
        monkeypatch.setattr(torch, "randn", randn)
        got = ours({"S2L2A": x}, seed=SEED)
    assert got.shape == (1, 12, 64, 64)
    s1 = MODALITIES["S1GRD"]
    mean = torch.tensor(s1.mean).view(1, -1, 1, 1)
    std = torch.tensor(s1.std).view(1, -1, 1, 1)
    standardised = (got[:, :2] - mean) / std  # ours leaves in dB
    assert float(want["S1GRD"].std()) > 0.05  # (an image, not a constant)
    assert float((standardised - want["S1GRD"]).abs().max()) <= TOL
    assert float((got[:, 2:] - want["LULC"]).abs().max()) <= TOL
