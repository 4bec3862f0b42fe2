"""TerraMind any-to-any generation as a served model: token passes, then denoising steps.

:class:`TerraMindGenerate` is a :class:`~geoserve.models.steps.SteppedModel`. For each
generated modality (in the order the engine's output kinds name them) one step samples its
tokens from the generator (:mod:`.generation`), conditioned on the inputs and on the tokens
generated before it; then each diffusion-decoded modality (S2L2A, S1GRD, S1RTC, DEM, NDVI)
takes its denoising steps, one UNet call each (:class:`~.tokenizers.DiVAE`); LULC is
decoded in one pass (:class:`~.tokenizers.VQVAE`) when the patch finishes. The plan of two
outputs S1GRD and LULC at 2 steps is ``tokens-s1grd, tokens-lulc, denoise-s1grd x 2``
(TerraTorch's trailing spacing: ``steps=2`` runs 2 UNet calls, ``steps=3`` runs 4).

The engine batches steps of one kind from every request, whatever their step index (each row
of a denoising batch at its own timestep).

**Random numbers**, all keyed by the request's seed and the scene position
(:func:`~geoserve.models.steps.noise_field`), so a patch's output never depends on its batch,
other requests or threads, and overlapping patches draw the same numbers where they overlap:

- a token's uniform number (top-p / temperature sampling through
  :func:`~.sampling.sample_tokens`) is the field of stream ``100 + i`` (the ``i``-th modality
  of :data:`GENERATED`) at one sample per 16-pixel token;
- a diffusion's initial noise is the standard normal field of stream ``200 + i`` at one
  sample per pixel.

Patches must therefore start on the token grid: patch size a multiple of 32 (the UNet's),
stride and margin multiples of 16.

**Units**: every output but LULC leaves in TerraMind's physical units, the standardised
prediction times its pretraining std plus mean (:data:`~.variants.MODALITIES`; S2 in L2A
digital numbers, S1 in dB, DEM in metres, NDVI as an index); LULC as its 10 class logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import nn

from geoserve.errors import ConfigError, InputError
from geoserve.models.steps import State, SteppedModel, noise_field
from geoserve.models.terramind.generation import OUTPUTS, TerraMindGenerator
from geoserve.models.terramind.sampling import (
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    ZERO_TEMPERATURE,
    sample_tokens,
)
from geoserve.models.terramind.tokenizers import VQVAE, DiVAE
from geoserve.models.terramind.tokenizers.ddim import DEFAULT_STEPS
from geoserve.models.terramind.variants import MODALITIES, PATCH_SIZE

#: The raw-pixel modalities a generator takes as input.
RAW_INPUTS = tuple(name for name, m in MODALITIES.items() if not m.tokenized)
#: The modalities TerraMind generates, in their fixed order (their random streams' order).
GENERATED = tuple(OUTPUTS)
#: Channels of each generated modality's output (LULC: class logits).
CHANNELS = {"S2L2A": 12, "S1GRD": 2, "S1RTC": 2, "DEM": 1, "NDVI": 1, "LULC": 10}
#: TerraTorch's default sampling temperature (``temps=1.0``).
DEFAULT_TEMPERATURE = 1.0
_TOKEN_STREAM, _NOISE_STREAM = 100, 200


def generated_for_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """The modalities output ``kinds`` ask TerraMind to generate, in their order.

    A modality's kind is its lower-case name (``s1grd``, ``lulc``); ``confidence`` is LULC's.

    Raises:
        ConfigError: a kind that is no generated modality, or none at all.
    """
    out: list[str] = []
    for kind in kinds:
        name = "LULC" if kind == "confidence" else kind.upper()
        if name not in CHANNELS:
            known = ", ".join([m.lower() for m in GENERATED] + ["confidence"])
            raise ConfigError(f"output kind {kind!r} is no generated modality; kinds: {known}")
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError("a generative model needs at least one output kind to generate")
    return tuple(out)


@dataclass(frozen=True)
class GenerationOptions:
    """How TerraMind generates (defaults: TerraTorch 1.2.13's ``TerraMindGeneration``).

    Attributes:
        steps: Denoising steps of each diffusion-decoded output (trailing spacing).
        temperature: Token sampling temperature; 0 takes the most likely token.
        top_p: Nucleus sampling threshold (0: every token).
        top_k: Sample among this many most likely tokens (0: every token).
        batch_invariant: Run the networks one patch at a time inside each batch, so a
            patch's output is the same bytes in any batch (float kernels sum in an order
            that may depend on the batch size); off: one call per batch.
    """

    steps: int = DEFAULT_STEPS
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    batch_invariant: bool = True

    def __post_init__(self) -> None:
        if (
            isinstance(self.steps, bool)
            or not isinstance(self.steps, int)
            or not (1 <= self.steps <= 1000)
        ):
            raise ConfigError(f"steps must be an integer from 1 to 1000, not {self.steps!r}")
        if not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"temperature must be a finite number >= 0, not {self.temperature}")
        if not 0 <= self.top_p <= 1:
            raise ConfigError(f"top_p must lie in [0, 1], not {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0, not {self.top_k!r}")

    def with_given(self, options: Mapping[str, Any]) -> GenerationOptions:
        """These options with those given replaced (unknown names refused)."""
        known = {"steps", "temperature", "top_p", "top_k", "batch_invariant"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown generation options: {', '.join(unknown)}")
        return replace(self, **dict(options))


class GenerationLoader(Protocol):
    """Where a :class:`TerraMindGenerate` gets its parts once it knows what to generate."""

    def generator(self, inputs: Sequence[str], outputs: Sequence[str]) -> TerraMindGenerator:
        """The token generator for ``inputs`` -> ``outputs`` (in generation order)."""

    def tokenizer(self, modality: str) -> DiVAE | VQVAE:
        """The decoder side of ``modality``'s tokenizer."""


class TerraMindGenerate(SteppedModel):
    """TerraMind v1 any-to-any generation, step by step (see the module docstring).

    Args:
        loader: Builds the generator and the tokenizers when :meth:`configure` (the engine,
            at start-up) says what to generate; see :meth:`from_parts` to give them directly.
        options: The default generation options (TerraTorch's if not given).
    """

    def __init__(
        self, loader: GenerationLoader | None, options: GenerationOptions | None = None
    ) -> None:
        super().__init__()
        self.loader = loader
        self.options = options or GenerationOptions()
        self.generator: TerraMindGenerator | None = None
        self.tokenizers = nn.ModuleDict()
        self.outputs: tuple[str, ...] = ()
        self._plan: tuple[str, ...] = ()
        self._first_denoise: dict[str, int] = {}

    @classmethod
    def from_parts(
        cls,
        generator: TerraMindGenerator,
        tokenizers: Mapping[str, DiVAE | VQVAE],
        options: GenerationOptions | None = None,
    ) -> TerraMindGenerate:
        """A model generating ``generator``'s outputs, with these tokenizers (ready to run)."""
        model = cls(None, options)
        model._fit(generator, dict(tokenizers))
        return model

    # -- configuration ------------------------------------------------------------------------

    def configure(
        self,
        *,
        kinds: Sequence[str],
        options: Mapping[str, Any],
        patch_size: int,
        stride: int,
    ) -> None:
        """Generate what ``kinds`` name, with ``options`` over the defaults, on this tiling."""
        self.options = self.options.with_given(options)
        margin = (patch_size - stride) // 2
        if patch_size % 32 or stride % PATCH_SIZE or margin % PATCH_SIZE:
            raise ConfigError(
                f"generation needs patches on TerraMind's token grid: patch_size "
                f"({patch_size}) a multiple of 32, stride ({stride}) and margin "
                f"((patch_size - stride) / 2 = {margin}) multiples of {PATCH_SIZE}; choose "
                "--patch-size and --stride to fit (e.g. 224 and 192)"
            )
        outputs = generated_for_kinds(kinds)
        if self.generator is not None:  # built from parts: what it generates is fixed
            missing = [o for o in outputs if o not in self.outputs]
            if missing:
                raise ConfigError(
                    f"this model generates {', '.join(self.outputs)}, not {', '.join(missing)}"
                )
            self._fit(self.generator, dict(self.tokenizers.items()))  # (the new options)
            return
        if self.loader is None:
            raise ConfigError("a TerraMind generation model needs a loader or its parts")
        generator = self.loader.generator(RAW_INPUTS, outputs)
        self._fit(generator, {o: self.loader.tokenizer(o) for o in outputs})

    def _fit(self, generator: TerraMindGenerator, tokenizers: dict[str, Any]) -> None:
        outputs = tuple(generator.outputs)
        for o in outputs:
            tok = tokenizers.get(o)
            want = VQVAE if o == "LULC" else DiVAE
            if not isinstance(tok, want):
                raise ConfigError(f"output {o} needs a {want.__name__} tokenizer, got {tok!r}")
        self.generator = generator
        self.tokenizers = nn.ModuleDict({o: tokenizers[o] for o in outputs})
        self.outputs = outputs
        plan = [f"tokens-{o.lower()}" for o in outputs]
        self._first_denoise = {}
        for o in outputs:
            tok = tokenizers[o]
            if isinstance(tok, DiVAE):
                self._first_denoise[o] = len(plan)
                plan += [f"denoise-{o.lower()}"] * len(tok.scheduler.schedule(self.options.steps))
        self._plan = tuple(plan)

    def request_kwargs(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """A request's sampling (``temperature``, ``top_p``, ``top_k``) over the engine's."""
        fixed = sorted(set(options) - {"temperature", "top_p", "top_k"})
        if fixed:
            raise ConfigError(f"{', '.join(fixed)}: set for the whole engine, not per request")
        opts = self.options.with_given(options)
        return {
            "temperature": np.asarray(opts.temperature, np.float64),
            "top_p": np.asarray(opts.top_p, np.float64),
            "top_k": np.asarray(opts.top_k, np.int64),
        }

    @property
    def channels(self) -> dict[str, int]:
        """Each generated modality's output channels, in output order."""
        return {o: CHANNELS[o] for o in self.outputs}

    def plan(self) -> tuple[str, ...]:
        """Token passes in output order, then each diffusion output's denoising steps."""
        return self._plan

    # -- steps --------------------------------------------------------------------------------

    def step(self, kind: str, state: State, index: torch.Tensor, **kwargs: torch.Tensor) -> State:
        """One token pass or one denoising step for a batch (rows of one kind)."""
        action, name = kind.split("-", 1)
        modality = name.upper()
        if action == "tokens":
            return self._tokens(modality, state, kwargs)
        return self._denoise(modality, state, index)

    def _inputs(self, state: State) -> dict[str, torch.Tensor]:
        return {k[2:]: v for k, v in state.items() if k.startswith("x_")}

    def _sampling(
        self, n: int, kwargs: Mapping[str, torch.Tensor]
    ) -> list[tuple[float, float, int]]:
        """Each row's (temperature, top_p, top_k): its request's, else the engine's."""
        o = self.options
        if "temperature" not in kwargs:
            return [(o.temperature, o.top_p, o.top_k)] * n
        return list(
            zip(
                kwargs["temperature"].tolist(),
                kwargs["top_p"].tolist(),
                [int(k) for k in kwargs["top_k"].tolist()],
                strict=True,
            )
        )

    def _tokens(self, modality: str, state: State, kwargs: Mapping[str, torch.Tensor]) -> State:
        generator = self._parts()
        inputs = self._inputs(state)
        if not inputs:
            raise InputError(f"no input modality; the generator takes {', '.join(RAW_INPUTS)}")
        first = next(iter(inputs.values()))
        size, device = int(first.shape[-1]), first.device
        h, w = generator.token_grid(int(first.shape[-2]), size)
        earlier = self.outputs[: self.outputs.index(modality)]
        generated = {o: state[f"tok_{o}"] for o in earlier}
        logits = self._rows_apart(lambda i, g: generator.logits(i, modality, g), inputs, generated)
        seeds, origins = _rows(state)
        sampling = self._sampling(len(seeds), kwargs)
        ids = torch.empty(logits.shape[:2], dtype=torch.int64, device=logits.device)
        stream = _TOKEN_STREAM + GENERATED.index(modality)
        for params in dict.fromkeys(sampling):  # rows sampled alike, together
            rows = [i for i, p in enumerate(sampling) if p == params]
            uniforms = None
            if params[0] > ZERO_TEMPERATURE:
                fields = [
                    noise_field(
                        seeds[i], stream, origins[i], (1, h, w), scale=PATCH_SIZE, dist="uniform"
                    )
                    for i in rows
                ]
                uniforms = torch.stack(fields).reshape(len(rows), h * w)
            ids[rows] = sample_tokens(logits[rows], *params, uniforms=uniforms)
        out = {**state, f"tok_{modality}": ids.reshape(-1, h, w)}
        if modality in self._first_denoise:  # its diffusion's initial noise, drawn once
            stream = _NOISE_STREAM + GENERATED.index(modality)
            shape = (CHANNELS[modality], int(first.shape[-2]), size)
            noise = [noise_field(s, stream, o, shape) for s, o in zip(seeds, origins, strict=True)]
            out[f"z_{modality}"] = torch.stack(noise).to(device)
        return out

    def _denoise(self, modality: str, state: State, index: torch.Tensor) -> State:
        tok = self.tokenizers[modality]
        assert isinstance(tok, DiVAE)
        schedule = tok.scheduler.schedule(self.options.steps)
        at = (index - self._first_denoise[modality]).tolist()
        z = state[f"z_{modality}"]
        t = torch.tensor([schedule[j][0] for j in at], device=z.device)
        t_prev = torch.tensor([schedule[j][1] for j in at], device=z.device)
        codes = tok.embed(state[f"tok_{modality}"])
        pred = self._rows_apart(lambda zc: tok.predict(zc[0], zc[1], zc[2]), (z, t, codes))
        z = tok.scheduler.step(z, pred, t, t_prev)
        return {**state, f"z_{modality}": z}

    def finish(self, state: State, **kwargs: torch.Tensor) -> torch.Tensor:
        """Every output in order, concatenated: physical units, LULC as class logits."""
        parts = []
        for o in self.outputs:
            tok = self.tokenizers[o]
            if isinstance(tok, VQVAE):
                parts.append(self._rows_apart(tok.decode_tokens, state[f"tok_{o}"]).float())
                continue
            z = state[f"z_{o}"]
            info = MODALITIES[o]
            mean = torch.tensor(info.mean, device=z.device).view(1, -1, 1, 1)
            std = torch.tensor(info.std, device=z.device).view(1, -1, 1, 1)
            parts.append(z * std + mean)
        return torch.cat(parts, dim=1)

    def _rows_apart(self, fn: Any, *args: Any) -> torch.Tensor:
        """``fn(*args)``; with :attr:`GenerationOptions.batch_invariant`, row by row.

        ``args``: tensors, tuples or dicts of them with the batch first; the rows' results
        are concatenated.
        """
        if not self.options.batch_invariant:
            return cast(torch.Tensor, fn(*args))
        first = _leaves(args)[0]
        rows = [fn(*_row(args, i)) for i in range(first.shape[0])]
        return torch.cat(rows, dim=0)

    def _parts(self) -> TerraMindGenerator:
        if self.generator is None:
            raise ConfigError("this TerraMind generation model is not configured yet")
        return self.generator


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, Mapping) else value
    return [t for v in items for t in _leaves(v)]


def _row(value: Any, i: int) -> Any:
    """Row ``i`` (kept as a batch of one) of every tensor in ``value``."""
    if isinstance(value, torch.Tensor):
        return value[i : i + 1]
    if isinstance(value, Mapping):
        return {k: _row(v, i) for k, v in value.items()}
    return tuple(_row(v, i) for v in value)


def _rows(state: State) -> tuple[list[int], list[tuple[int, int]]]:
    seeds = [int(s) for s in state["seed"].tolist()]
    origins = [(int(r), int(c)) for r, c in state["origin"].tolist()]
    return seeds, origins
