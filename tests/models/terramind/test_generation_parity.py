"""TerraMind's token generator against TerraTorch 1.2.13's own code (tiny, random weights, fp32)."""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from geoserve.errors import ConfigError, InputError, WeightsError
from geoserve.models.state_dict import load_strict
from geoserve.models.terramind.generation import TerraMindGenerator, generator_args
from geoserve.models.terramind.generation_weights import generator_state, load_generator
from geoserve.models.terramind.sampling import generate_tokens, sample_tokens
from tests.models.terramind import reference

TOL = 1e-4
CHANNELS = {"S2L2A": 12, "S2L1C": 13, "S1GRD": 2, "S1RTC": 2, "DEM": 1, "RGB": 3}


def _randomise(model: nn.Module, seed: int) -> None:
    """Weights away from their init (norm scales around 1), so every path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            scale = name.endswith(("norm.weight", "norm1.weight", "norm2.weight"))
            p.copy_(1 + 0.1 * noise if scale else 0.05 * noise)


def _inputs(names: list[str], shape: tuple[int, int], seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(2, CHANNELS[n], *shape, generator=g) for n in names}


def _pair(inputs: list[str], outputs: list[str]) -> tuple[nn.Module, TerraMindGenerator]:
    """TerraTorch's generator (randomised) and ours with its weights."""
    torch.manual_seed(0)
    ref = reference.generation("tiny", modalities=inputs, output_modalities=outputs, temps=0.0)
    _randomise(ref, 0)
    ref.eval()
    ours = TerraMindGenerator(inputs, outputs, **generator_args("tiny"))
    load_strict(ours, generator_state(ref.state_dict(), ours), "TerraTorch's state dict")
    return ref, ours.eval()


@pytest.fixture(scope="module")
def chained() -> tuple[nn.Module, TerraMindGenerator]:
    return _pair(["S2L2A"], ["S1GRD", "LULC"])


class _Reference:
    """TerraTorch's generation state of one batch, as ``TerraMindGeneration.forward`` builds it."""

    def __init__(self, ref: Any, x: dict[str, torch.Tensor]) -> None:
        self.ref, self.gen = ref, reference.generate_module()
        info = ref.sampler.model.modality_info
        first = next(iter(x.values()))
        batch, self.n = first.shape[0], first.shape[-2] * first.shape[-1] // 256
        self.mod_dict: dict[str, Any] = {}
        for name, value in x.items():
            key = ref.mod_name_mapping[name]
            masks = {
                "input_mask": torch.zeros(batch, self.n, dtype=torch.bool),
                "target_mask": torch.ones(batch, self.n, dtype=torch.bool),
                "decoder_attention_mask": torch.zeros(batch, self.n, dtype=torch.bool),
            }
            self.mod_dict[key] = self.gen.init_full_input_modality(
                {"tensor": value, **masks}, info, key, "cpu"
            )
        for key in ref.output_modalities:
            self.mod_dict[key] = self.gen.init_empty_target_modality(
                info, key, batch, self.n, "cpu"
            )

    def logits(self, output: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Its logits for ``output``, put back in position order, and the order it drew."""
        key = self.ref.mod_name_mapping[output]
        with torch.random.fork_rng(), torch.no_grad():  # it reseeds the global generator
            logits, pos = self.ref.sampler.forward_enc_dec_roar_batched(
                self.mod_dict, key, self.n, seed=seed
            )
        ordered = torch.empty_like(logits)
        ordered.scatter_(1, pos.unsqueeze(-1).expand_as(logits), logits)
        return ordered, pos

    def condition(self, output: str, tokens: torch.Tensor) -> None:
        """Mark ``output``'s tokens generated, as its ROAR step does."""
        d = self.mod_dict[self.ref.mod_name_mapping[output]]
        d["tensor"] = tokens.reshape(tokens.shape[0], -1).clone()
        d["input_mask"] = torch.zeros_like(d["input_mask"])
        d["target_mask"] = torch.ones_like(d["target_mask"])


@pytest.mark.parametrize(
    ("inputs", "outputs", "size"),
    [(["S2L2A"], ["S1GRD"], 64), (["S1GRD"], ["DEM"], 48), (["S2L2A"], ["S1GRD", "LULC"], 64)],
)
def test_logits_match_the_reference(inputs: list[str], outputs: list[str], size: int) -> None:
    """Every output's logits, each later output conditioned on the earlier ones' tokens."""
    ref, ours = _pair(inputs, outputs)
    x = _inputs(inputs, (size, size))
    state = _Reference(ref, {k: v.clone() for k, v in x.items()})
    generated: dict[str, torch.Tensor] = {}
    for step, name in enumerate(outputs):
        want, _ = state.logits(name, seed=step)
        with torch.no_grad():
            got = ours.logits(x, name, generated)
        assert got.shape == want.shape == (2, (size // 16) ** 2, ours.vocab_size(name))
        assert float((got - want).abs().max()) <= TOL
        assert float(want.std()) > 0.1  # the comparison carries signal
        tokens = want.argmax(-1)
        state.condition(name, tokens)
        generated[name] = tokens.reshape(2, size // 16, size // 16)
    if len(outputs) > 1:  # and the conditioning changed the chained output
        with torch.no_grad():
            alone = ours.logits(x, outputs[-1])
        assert float((alone - got).abs().max()) > 0.1


def test_logits_do_not_depend_on_the_shuffle(chained: tuple[nn.Module, TerraMindGenerator]) -> None:
    """TerraTorch decodes in a random order; put back in place its logits are the same."""
    ref, ours = chained
    x = _inputs(["S2L2A"], (64, 64))
    state = _Reference(ref, x)
    first, order_a = state.logits("S1GRD", seed=1)
    second, order_b = state.logits("S1GRD", seed=2)
    assert not torch.equal(order_a, order_b)
    assert float((first - second).abs().max()) <= 1e-5
    with torch.no_grad():
        assert float((ours.logits(x, "S1GRD") - first).abs().max()) <= TOL


def test_argmax_tokens_equal_the_references_generation(
    chained: tuple[nn.Module, TerraMindGenerator],
) -> None:
    """TerraTorch's whole generation at temperature 0 (decode stubbed to return its tokens)."""
    ref, ours = chained
    x = _inputs(["S2L2A"], (64, 64), seed=3)
    random.seed(0)
    with torch.random.fork_rng(), torch.no_grad():
        want = ref({k: v.clone() for k, v in x.items()})
    with torch.no_grad():
        got = generate_tokens(ours, x, temperature=0.0)
    assert set(got) == {"S1GRD", "LULC"}
    for name in got:
        assert got[name].shape == want[name].shape == (2, 4, 4)
        assert torch.equal(got[name], want[name])
    assert len(torch.unique(got["S1GRD"])) > 4


def test_a_non_square_input_gives_its_own_grid(
    chained: tuple[nn.Module, TerraMindGenerator],
) -> None:
    """32 x 64 px -> 2 x 4 tokens, positions laid out as the image's (TerraTorch's resize)."""
    _, ours = chained
    x = _inputs(["S2L2A"], (32, 64))
    assert ours.token_grid(32, 64) == (2, 4)
    with torch.no_grad():
        logits = ours.logits(x, "S1GRD")
        tokens = generate_tokens(ours, x, temperature=0.0)
    assert logits.shape == (2, 8, 15360)
    assert tokens["S1GRD"].shape == tokens["LULC"].shape == (2, 2, 4)
    assert torch.equal(tokens["S1GRD"].reshape(2, 8), logits.argmax(-1))
    # TerraTorch resizes an image input's table to (H/16, W/16); the token grids follow it
    reference.load()
    utils = importlib.import_module("terratorch.models.backbones.terramind.model.tm_utils")
    image = ours.encoder_embeddings["untok_sen2l2a@224"]
    table = image.get_buffer("pos_emb")
    want = utils.interpolate_pos_encoding(table.clone(), 32, 64, (16, 16), 192)
    assert torch.equal(image.positions(2, 4), want)
    for emb in (
        ours.decoder_embeddings["tok_lulc@224"],
        ours.encoder_embeddings["tok_sen1grd@224"],
    ):
        assert torch.equal(emb.get_buffer("pos_emb"), table)
        assert torch.equal(emb.positions(2, 4), want + emb.mod_emb)


def test_inputs_are_checked(chained: tuple[nn.Module, TerraMindGenerator]) -> None:
    _, ours = chained
    x = _inputs(["S2L2A"], (32, 32))
    tokens = torch.zeros(2, 2, 2, dtype=torch.long)
    for bad, match in [
        (lambda: ours.logits(_inputs(["S2L2A"], (40, 32)), "S1GRD"), "multiple of 16"),
        (lambda: ours.logits(_inputs(["S1GRD"], (32, 32)), "S1GRD"), "unknown input 'S1GRD'"),
        (lambda: ours.logits({"S2L2A": x["S2L2A"][:, :3]}, "S1GRD"), "3 bands; expected 12"),
        (lambda: ours.logits(x, "DEM"), "not an output"),
        (lambda: ours.logits(x, "S1GRD", {"S1GRD": tokens}), "only outputs generated before"),
        (lambda: ours.logits(x, "LULC", {"S1GRD": tokens + 15360}), r"outside 0\.\.15359"),
        (lambda: ours.logits(x, "LULC", {"S1GRD": tokens[:, :1]}), "expected \\(2, 2, 2\\)"),
        (lambda: generate_tokens(ours, x, temperature=1.0), "no uniforms for output 'S1GRD'"),
    ]:
        with pytest.raises(InputError, match=match):
            bad()
    for args, match in [
        ((["LULC"], ["S1GRD"]), "tokenizer encoder"),
        ((["S2L2A"], ["S2L1C"]), "does not generate 'S2L1C'"),
        ((["S2L2A"], ["RGB"]), "does not generate 'RGB'"),
        ((["S2L2A"], ["S1GRD", "s1grd"]), "two outputs"),
    ]:
        with pytest.raises(ConfigError, match=match):
            TerraMindGenerator(*args, **generator_args("tiny"))


@pytest.mark.parametrize(
    ("variant", "inputs", "outputs"),
    [
        ("tiny", ["S2L2A"], ["S1GRD", "LULC"]),
        ("small", ["S2L1C", "S1RTC", "DEM", "RGB"], ["S2L2A", "NDVI", "S1GRD"]),
        ("base", ["S1GRD", "DEM"], ["S2L2A", "LULC"]),
        ("large", ["S2L2A", "S1GRD"], ["DEM", "S1RTC"]),
    ],
)
def test_state_dict_names_and_shapes_match(
    monkeypatch: pytest.MonkeyPatch, variant: str, inputs: list[str], outputs: list[str]
) -> None:
    """On the meta device: the keys, shapes and (tied) parameter count of ``sampler.model``."""
    linspace = torch.linspace  # the reference reads its drop-path rates with .item()
    monkeypatch.setattr(torch, "linspace", lambda *a, **k: linspace(*a, **k, device="cpu"))
    with torch.device("meta"):
        ref = reference.generation(variant, modalities=inputs, output_modalities=outputs)
        ours = TerraMindGenerator(inputs, outputs, **generator_args(variant))
    prefix = "sampler.model."
    assert all(k.startswith(prefix) for k in ref.state_dict())
    want = {k[len(prefix) :]: tuple(v.shape) for k, v in ref.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert got == want
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def test_checkpoints_load_strictly_in_both_layouts(
    tmp_path: Path, chained: tuple[nn.Module, TerraMindGenerator]
) -> None:
    """TerraTorch's ``sampler.model.`` state dict, and the bare pretraining layout with more."""
    _, ours = chained
    with torch.random.fork_rng():
        bigger, _ = _pair(["S2L2A", "S1GRD", "DEM"], ["S1GRD", "DEM", "LULC"])
    prefixed = {k: v for k, v in bigger.state_dict().items()}
    bare = {k.removeprefix("sampler.model."): v for k, v in prefixed.items()}
    for key in [k for k in bare if k.endswith(("pos_emb", "norm1.bias", "to_logits.weight"))]:
        del bare[key]  # fixed tables, zero biases and tied copies come from the model
    torch.save(prefixed, tmp_path / "generation.pt")
    torch.save(bare, tmp_path / "TerraMind_v1_tiny.pt")
    x = _inputs(["S2L2A"], (32, 32))
    results = []
    for name in ("generation.pt", "TerraMind_v1_tiny.pt"):
        model = load_generator(tmp_path / name, ["S2L2A"], ["S1GRD", "LULC"])
        assert not model.training
        dec = model.decoder_embeddings["tok_sen1grd@224"]
        assert dec.to_logits.weight is dec.token_emb.weight
        assert dec.mod_emb is model.encoder_embeddings["tok_sen1grd@224"].mod_emb
        with torch.no_grad():
            results.append(model.logits(x, "LULC", {"S1GRD": torch.ones(2, 2, 2, dtype=int)}))
    assert torch.equal(results[0], results[1])
    key = "encoder_embeddings.untok_sen2l2a@224.proj.weight"
    assert torch.equal(model.state_dict()[key], prefixed["sampler.model." + key])
    del bare["decoder.0.cross_attn.kv.weight"]
    torch.save(bare, tmp_path / "incomplete.pt")
    with pytest.raises(WeightsError, match=r"missing \['decoder\.0\.cross_attn\.kv\.weight'\]"):
        load_generator(tmp_path / "incomplete.pt", ["S2L2A"], ["S1GRD", "LULC"])
    with pytest.raises(WeightsError, match="shape mismatch"):
        load_generator(tmp_path / "generation.pt", ["S2L2A"], ["S1GRD"], variant="small")
    torch.save({"encoder.0.attn.qkv.weight": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(WeightsError, match="no mask_token"):
        load_generator(tmp_path / "other.pt", ["S2L2A"], ["S1GRD"])
    assert ours.vocab_size("LULC") == 4375


def _reference_filter(logits: torch.Tensor, top_k: Any, top_p: float) -> torch.Tensor:
    sampler = reference.generate_module().GenerationSampler(nn.Identity())
    return sampler.top_k_top_p_filtering(logits.clone(), top_k=top_k, top_p=top_p)


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(4)) * 2


def _uniforms(shape: tuple[int, ...], seed: int = 5) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def test_temperature_zero_and_top_k_one_are_argmax(logits: torch.Tensor) -> None:
    before = logits.clone()
    u = _uniforms(logits.shape[:2])
    assert torch.equal(sample_tokens(logits, 0.0), logits.argmax(-1))
    assert torch.equal(sample_tokens(logits, 1e-11, 0.8, 0, u), logits.argmax(-1))
    for temperature in (0.5, 1.0, 3.0):
        assert torch.equal(sample_tokens(logits, temperature, 0.0, 1, u), logits.argmax(-1))
    assert not torch.equal(sample_tokens(logits, 1.0, 0.0, 0, u), logits.argmax(-1))
    assert torch.equal(logits, before)  # TerraTorch's filter writes into its argument


def test_a_uniform_maps_through_the_inverse_cdf() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().reshape(1, 1, 4).expand(1, 6, 4)
    u = torch.tensor([[0.0, 0.05, 0.15, 0.29, 0.31, 0.999]])
    assert sample_tokens(logits, 1.0, 0.0, 0, u).tolist() == [[0, 0, 1, 1, 2, 3]]
    # top-k 2 keeps 0.3 and 0.4, renormalised to 3/7 and 4/7
    u = torch.tensor([[0.0, 0.4, 0.44, 0.9, 0.5, 0.2]])
    assert sample_tokens(logits, 1.0, 0.0, 2, u).tolist() == [[2, 2, 3, 3, 3, 2]]


def test_top_p_is_applied_before_the_temperature() -> None:
    """0.5, 0.3, 0.15, 0.05 at top-p 0.7 keeps two tokens whatever the temperature."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().reshape(1, 1, 4)
    u = torch.tensor([[0.999]])
    assert sample_tokens(logits, 1.0, 0.7, 0, u).tolist() == [[1]]
    assert sample_tokens(logits, 2.0, 0.7, 0, u).tolist() == [[1]]  # tempered, it would keep 3
    assert sample_tokens(logits, 1.0, 0.0, 0, u).tolist() == [[3]]


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.0), (0, 0.8), (10, 0.0), (0.3, 0.9)])
def test_draws_are_distributed_as_the_references(
    logits: torch.Tensor, top_k: Any, top_p: float
) -> None:
    """Evenly spread uniforms hit each token as often as TerraTorch's filtered softmax says."""
    m, temperature = 4000, 0.7
    rows = logits.reshape(-1, 50)[:4]
    u = ((torch.arange(m) + 0.5) / m).reshape(1, m).expand(4, m)
    tokens = sample_tokens(rows.unsqueeze(1).expand(4, m, 50), temperature, top_p, top_k, u)
    freq = torch.stack([torch.bincount(t, minlength=50) for t in tokens]).double() / m
    want = torch.softmax(_reference_filter(rows, top_k, top_p) / temperature, dim=-1).double()
    assert float((freq - want).abs().max()) <= 1.0 / m + 1e-6
    assert int((want > 0).sum(-1).min()) > 1


def test_a_token_does_not_depend_on_its_batch(logits: torch.Tensor) -> None:
    u = _uniforms(logits.shape[:2])
    whole = sample_tokens(logits, 0.9, 0.8, 20, u)
    for b in range(logits.shape[0]):
        alone = sample_tokens(logits[b : b + 1], 0.9, 0.8, 20, u[b : b + 1])
        assert torch.equal(alone[0], whole[b])
    flipped = sample_tokens(logits.flip(0), 0.9, 0.8, 20, u.flip(0))
    assert torch.equal(flipped.flip(0), whole)


def test_sampling_options_are_checked(logits: torch.Tensor) -> None:
    u = _uniforms(logits.shape[:2])
    for kwargs, error, match in [
        ({"temperature": -1.0, "uniforms": u}, ConfigError, "temperature"),
        ({"temperature": float("nan"), "uniforms": u}, ConfigError, "temperature"),
        ({"temperature": 1.0, "top_p": 1.5, "uniforms": u}, ConfigError, "top_p"),
        ({"temperature": 1.0, "top_k": -2, "uniforms": u}, ConfigError, "top_k"),
        ({"temperature": 1.0}, InputError, "uniform"),
        ({"temperature": 1.0, "uniforms": u[:, :2]}, InputError, "shape"),
        ({"temperature": 1.0, "uniforms": u + 1.0}, InputError, r"\[0, 1\)"),
    ]:
        with pytest.raises(error, match=match):
            sample_tokens(logits, **kwargs)


def test_sampled_generation_follows_the_uniforms(
    chained: tuple[nn.Module, TerraMindGenerator],
) -> None:
    """The same numbers give the same tokens; a patch's tokens do not depend on its batch."""
    _, ours = chained
    x = _inputs(["S2L2A"], (32, 32), seed=7)
    u = {name: _uniforms((2, 2, 2), seed=i) for i, name in enumerate(ours.outputs)}
    with torch.no_grad():
        a = generate_tokens(ours, x, temperature=1.0, top_p=0.0, uniforms=u)
        b = generate_tokens(ours, x, temperature=1.0, top_p=0.0, uniforms=u)
        one = generate_tokens(
            ours,
            {k: v[1:] for k, v in x.items()},
            temperature=1.0,
            top_p=0.0,
            uniforms={k: v[1:] for k, v in u.items()},
        )
    for name in ours.outputs:
        assert torch.equal(a[name], b[name])
        assert torch.equal(one[name][0], a[name][1])
