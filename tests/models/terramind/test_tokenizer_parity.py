"""TerraMind tokenizers against TerraTorch 1.2.13's own files (random weights, fp32).

FSQ both ways and the DDIM schedule and step are compared exactly; one UNet call, a whole
``decode_tokens`` from the same noise and the LULC VQVAE to 1e-4, at small widths where the
classes take them (the architecture is under test, not the size). Every zero-initialised
tensor (TerraTorch zeroes each residual block's last convolution, the attention projections
and the UNet's output convolution, so a fresh UNet outputs exactly 0) is randomised first.
Full-size names and shapes are compared on the meta device.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from geoserve.errors import UnknownNameError, WeightsError
from geoserve.models.terramind.tokenizers import (
    DDIM,
    FSQ,
    TOKENIZERS,
    VQVAE,
    DiVAE,
    build_tokenizer,
    load_tokenizer,
    tokenizer_spec,
)
from geoserve.models.terramind.tokenizers.unet import PatchedUNet
from tests.generate_stub import TINY_UNET, TINY_VIT
from tests.generate_stub import randomise as _randomise
from tests.models.terramind import reference

TOL = 1e-4
SMALL_UNET = TINY_UNET
SMALL_VIT = TINY_VIT


def _ref_unet(channels: int, num_heads: int = 1) -> nn.Module:
    """TerraTorch's patched UNet as ``unet_patched`` builds it, but narrower and shallower."""
    ref = reference.load_tokenizers().unet.PatchedUNetCondCat(
        in_channels=channels,
        out_channels=channels,
        cond_channels=5,
        patch_size=4,
        model_channels=SMALL_UNET["model_channels"],
        num_res_blocks=SMALL_UNET["num_res_blocks"],
        attention_resolutions=[4, 8],
        channel_mult=(1, 2, 2, 2),
        num_heads=num_heads,
    )
    _randomise(ref, 0)
    return ref.eval()


def _ref_scheduler() -> object:
    """TerraTorch's DDIM scheduler with the options ``DiVAE`` gives it."""
    return reference.load_tokenizers().ddim.DDIMScheduler(
        num_train_timesteps=1000,
        thresholding=True,
        clip_sample=True,
        beta_schedule="linear",
        prediction_type="sample",
        zero_terminal_snr=True,
    )


def _tokens(shape: tuple[int, ...], vocabulary: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocabulary, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("levels", ["8-8-8-6-5", "7-5-5-5-5"])
def test_fsq_matches_the_reference_both_ways(levels: str) -> None:
    ref = reference.load_tokenizers().fsq.FiniteScalarQuantizer(levels)
    ours = FSQ([int(n) for n in levels.split("-")])
    assert ours.codebook_size == ref.codebook_size
    every = torch.arange(ours.codebook_size)
    codes = ours.indices_to_codes(every)
    assert torch.equal(codes, ref.indice_to_code(every))
    assert torch.equal(ours.codes_to_indices(codes), every)
    assert len({tuple(c) for c in codes.tolist()}) == ours.codebook_size  # one code per index
    grid = _tokens((2, 3, 5), ours.codebook_size)
    assert torch.equal(ours.embed(grid), ref.indices_to_embedding(grid))
    latent = 3 * torch.randn(2, ours.dim, 4, 6, generator=torch.Generator().manual_seed(1))
    want_codes, _, want_tokens = ref(latent)
    got_codes, got_tokens = ours(latent)
    assert torch.equal(got_codes, want_codes)
    assert torch.equal(got_tokens, want_tokens.long())
    assert torch.equal(ours.embed(got_tokens), got_codes)
    with pytest.raises(ValueError, match="must lie in 0"):
        ours.indices_to_codes(torch.tensor([ours.codebook_size]))
    with pytest.raises(ValueError, match="integers"):
        ours.indices_to_codes(torch.tensor([1.0]))


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 30, 50])
def test_ddim_timesteps_and_step_match_the_reference(steps: int) -> None:
    ref, ours = _ref_scheduler(), DDIM()
    assert torch.equal(ours.alphas_cumprod, ref.alphas_cumprod)
    assert float(ours.alphas_cumprod[-1]) == 0.0
    ref.set_timesteps(steps, mode="trailing")
    assert ours.timesteps(steps) == ref.timesteps.tolist()
    assert len(ours.timesteps(steps)) == {3: 4, 7: 8, 30: 31}.get(steps, steps)
    g = torch.Generator().manual_seed(steps)
    x_t = torch.randn(3, 2, 8, 8, generator=g)
    out = 1.5 * torch.randn(3, 2, 8, 8, generator=g)  # beyond [-1, 1]: the clamp matters
    rows = []
    for t, t_prev in ours.schedule(steps):
        want = ref.step(out, torch.tensor(t), x_t).prev_sample
        assert torch.equal(ours.step(x_t, out, t, t_prev), want), t
        rows.append((t, t_prev, want))
    # one batch whose rows sit at different steps: each row as if stepped alone
    picks = [rows[0], rows[-1], rows[len(rows) // 2]]
    t = torch.tensor([p[0] for p in picks])
    t_prev = torch.tensor([p[1] for p in picks])
    mixed = ours.step(x_t, out, t, t_prev)
    for i, (_, _, want) in enumerate(picks):
        assert torch.equal(mixed[i], want[i])
    assert float(ours.step(x_t, out, rows[-1][0], rows[-1][1]).abs().max()) <= 1.0


def test_ddim_spacing_differs_from_diffusers_where_1000_is_not_divisible() -> None:
    """Why the sampler is not diffusers': its trailing lists differ for 3 steps, agree for 50."""
    from diffusers import DDIMScheduler

    theirs = DDIMScheduler(timestep_spacing="trailing", rescale_betas_zero_snr=True)
    for steps, same in ((50, True), (3, False)):
        theirs.set_timesteps(steps)
        assert (theirs.timesteps.tolist() == DDIM().timesteps(steps)) is same
    with pytest.raises(ValueError, match="positive integer"):
        DDIM().timesteps(0)
    with pytest.raises(ValueError, match="at most 1000"):
        DDIM().timesteps(1001)


@pytest.mark.parametrize("num_heads", [1, 2])
def test_one_unet_call_matches_the_reference(num_heads: int) -> None:
    ref = _ref_unet(2, num_heads)
    ours = PatchedUNet(2, 5, num_heads=num_heads, **SMALL_UNET)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours.eval()
    g = torch.Generator().manual_seed(5)
    x_t = torch.randn(2, 2, 64, 64, generator=g)
    codes = FSQ((8, 8, 8, 6, 5)).embed(_tokens((2, 4, 4), 15360))
    t = torch.tensor([999, 321])
    with torch.no_grad():
        want = ref(x_t, t, codes)
        got = ours(x_t, t, codes)
        assert float(want.std()) > 0.05  # the comparison carries signal
        assert float((got - want).abs().max()) <= TOL
        one = ours(x_t[1:], 321, codes[1:])  # a row at its own timestep, alone
        assert float((one - got[1:]).abs().max()) <= 1e-5
        same_t = ref(x_t, torch.tensor(500), codes)
        assert float((ours(x_t, 500, codes) - same_t).abs().max()) <= TOL
    with pytest.raises(ValueError, match="multiple of 32"):
        ours(torch.zeros(1, 2, 80, 80), 0, torch.zeros(1, 5, 5, 5))
    with pytest.raises(ValueError, match="timesteps for a batch"):
        ours(x_t, torch.tensor([1, 2, 3]), codes)


@pytest.mark.parametrize("steps", [2, 3])
def test_decode_tokens_matches_the_reference(steps: int) -> None:
    """TerraTorch's ``DiVAE.decode_tokens`` (its pipeline and scheduler) from the same noise."""
    ref = reference.tokenizer("s1grd")
    ref.decoder = _ref_unet(2)
    ours = DiVAE(2, encoder=False, unet=SMALL_UNET)
    ours.decoder.load_state_dict(ref.decoder.state_dict(), strict=True)
    ours.eval()
    tokens = _tokens((2, 4, 4), 15360)
    want = ref.decode_tokens(
        tokens, timesteps=steps, generator=torch.Generator().manual_seed(7), verbose=False
    )
    noise = torch.randn(2, 2, 64, 64, generator=torch.Generator().manual_seed(7))
    got = ours.decode_tokens(tokens, noise, steps=steps)
    assert got.shape == (2, 2, 64, 64)
    assert float(want.std()) > 0.05
    assert float((got - want).abs().max()) <= TOL
    assert float(got.abs().max()) <= 1.0
    with pytest.raises(ValueError, match="noise must be"):
        ours.decode_tokens(tokens, noise[:, :1], steps=steps)
    with pytest.raises(ValueError, match="without its encoder"):
        ours.tokenize(noise)


def test_a_bf16_tokenizer_decodes_float32_noise() -> None:
    """Not a TerraTorch feature (its UNet fails in bf16): weights in bf16, noise and steps fp32."""
    full = DiVAE(2, vit=SMALL_VIT, unet=SMALL_UNET)
    _randomise(full, 4)
    half = DiVAE(2, vit=SMALL_VIT, unet=SMALL_UNET)
    half.load_state_dict(full.state_dict())
    full.eval(), half.to(torch.bfloat16).eval()
    tokens = _tokens((1, 4, 4), 15360)
    noise = torch.randn(1, 2, 64, 64, generator=torch.Generator().manual_seed(8))
    want = full.decode_tokens(tokens, noise, steps=2)
    got = half.decode_tokens(tokens, noise, steps=2)
    assert got.dtype == torch.float32
    assert float((got - want).abs().max()) <= 0.05
    with torch.no_grad():
        assert half.tokenize(noise).shape == (1, 4, 4)


def _small_ref_vq(ref: nn.Module, channels: int, decoder: bool) -> None:
    """Replace a reference tokenizer's ViT-B parts by narrow, shallow ones of the same classes."""
    vit = reference.load_tokenizers().vit
    size = dict(patch_size=16, resolution=256, dim_tokens=64, depth=2, num_heads=4, post_mlp=True)
    ref.encoder = vit.ViTEncoder(in_channels=channels, **size)
    ref.quant_proj = nn.Conv2d(64, 5, 1)
    if decoder:
        ref.decoder = vit.ViTDecoder(out_channels=channels, **size)
        ref.post_quant_proj = nn.Conv2d(5, 64, 1)


def test_lulc_vqvae_logits_and_tokens_match_the_reference() -> None:
    ref = reference.tokenizer("lulc")
    _small_ref_vq(ref, 10, decoder=True)
    ours = VQVAE(10, vit=SMALL_VIT)
    fresh, theirs = ours.state_dict(), ref.state_dict()
    for key in ("encoder.pos_emb", "decoder.pos_emb"):  # the fixed sin-cos tables, alike
        assert torch.equal(fresh[key], theirs[key]), key
    _randomise(ref, 1)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.eval(), ours.eval()
    tokens = _tokens((2, 4, 4), 4375)
    classes = torch.randint(0, 10, (2, 64, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref.decode_tokens(tokens)
        got = ours.decode_tokens(tokens)
        assert got.shape == (2, 10, 64, 64)
        assert float(want.std()) > 0.05
        assert float((got - want).abs().max()) <= TOL
        assert torch.equal(ours.tokenize(classes), ref.tokenize(classes).long())
        assert torch.equal(ours.tokenize(classes[:, None]), ours.tokenize(classes))
    with pytest.raises(ValueError, match="class numbers must lie in 0..9"):
        ours.tokenize(torch.full((1, 64, 64), 10))


def test_divae_encoder_tokens_match_the_reference() -> None:
    ref = reference.tokenizer("dem")
    _small_ref_vq(ref, 1, decoder=False)
    _randomise(ref.encoder, 2)
    _randomise(ref.quant_proj, 3)
    ours = DiVAE(1, vit=SMALL_VIT, unet=SMALL_UNET)
    ours.encoder.load_state_dict(ref.encoder.state_dict(), strict=True)
    ours.quant_proj.load_state_dict(ref.quant_proj.state_dict(), strict=True)
    x = torch.randn(2, 1, 64, 96, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref.tokenize(x)
        got = ours.tokenize(x)
    assert got.shape == (2, 4, 6)
    assert torch.equal(got, want.long())
    assert len(got.unique()) > 4


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("modality", list(TOKENIZERS))
def test_full_size_names_and_shapes_match_the_reference(modality: str) -> None:
    want = _shapes(reference.tokenizer(modality.lower()))
    with torch.device("meta"):
        ours = build_tokenizer(modality)
        decoder_only = build_tokenizer(modality, encoder=False)
    assert _shapes(ours) == want
    assert all(v.is_meta for v in ours.state_dict().values())
    side = {k: v for k, v in want.items() if not k.startswith(("encoder.", "quant_proj."))}
    assert _shapes(decoder_only) == side
    spec = tokenizer_spec(modality)
    assert spec.vocabulary == (4375 if modality == "LULC" else 15360)
    assert tokenizer_spec(spec.key) is spec is tokenizer_spec(modality.lower())


def test_loader_is_strict_and_names_what_does_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "TerraMind_Tokenizer_DEM.pt"
    torch.save({"encoder.proj.weight": torch.zeros(768, 3, 16, 16), "extra": torch.zeros(1)}, path)
    with pytest.raises(WeightsError) as err:
        load_tokenizer(path, "DEM")
    text = str(err.value)
    assert str(path) in text
    assert "DEM tokenizer" in text
    assert "unexpected ['extra']" in text
    assert "missing ['encoder.pos_emb'" in text
    assert "shape mismatch at encoder.proj.weight: checkpoint (768, 3, 16, 16)" in text
    with pytest.raises(WeightsError, match="no tensors under 'tokenizer.tok_dem@224.'"):
        load_tokenizer(path, "DEM", prefix="tokenizer.tok_dem@224.")
    with pytest.raises(UnknownNameError, match="unknown TerraMind tokenizer 'S3'"):
        load_tokenizer(path, "S3")


def test_loader_reads_a_decoder_side_checkpoint(tmp_path: Path) -> None:
    """The full-size LULC decoder under a generation model's prefix; encoder tensors skipped."""
    torch.manual_seed(0)
    model = build_tokenizer("LULC", encoder=False).eval()
    prefix = "tokenizer.tok_lulc@224."
    state = {prefix + k: v for k, v in model.state_dict().items()}
    state[prefix + "encoder.proj.weight"] = torch.zeros(1)  # skipped: encoder=False
    state["sampler.model.mask_token"] = torch.zeros(1, 1, 192)  # outside the prefix
    path = tmp_path / "generation.pt"
    torch.save(state, path)
    del state
    loaded = load_tokenizer(path, "lulc", encoder=False, prefix=prefix)
    assert isinstance(loaded, VQVAE)
    assert loaded.encoder is None
    assert not loaded.training
    tokens = _tokens((1, 2, 2), 4375)
    with torch.no_grad():
        assert torch.equal(loaded.decode_tokens(tokens), model.decode_tokens(tokens))
