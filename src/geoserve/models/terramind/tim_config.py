"""A TerraMind TiM fine-tune's options, as TerraTorch's ``terramind_v1_<size>_tim`` takes them.

A TerraTorch fine-tune config names a "Thinking in Modalities" backbone as
``backbone: terramind_v1_<size>_tim`` and gives the builder's TiM arguments with the
factory's ``backbone_`` prefix: ``backbone_tim_modalities`` (default ``[LULC]``),
``backbone_tim_chained_generations`` (default true), ``backbone_tim_decoding_steps`` (1),
``backbone_tim_temps`` (1.0), ``backbone_tim_top_p`` (0.8) and ``backbone_tim_top_k`` (0),
TerraTorch 1.2.13's ``TerraMindTiM`` defaults.

TiM modality names follow TerraTorch's rules (``build_tim_modality_embeddings``): any
``s2``/``sen2`` name is S2 L2A's tokens, ``s1rtc`` S1 RTC's, any other ``s1`` name S1 GRD's,
then ``dem``, ``lulc``, ``ndvi``, or a token key such as ``tok_lulc@224``. Captions and
coordinates (``caption``/``text``, ``coords``/``location``) are generated with TerraMind's
text tokenizer from the Hugging Face Hub, which geoserve does not run: a config asking for them
is refused. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geoserve.errors import ConfigError, WeightsError

#: TerraTorch 1.2.13's ``TerraMindTiM`` sampling defaults (temperature 1, nucleus 0.8).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 0.8
DEFAULT_TOP_K = 0

#: The token keys TiM generates, by geoserve's output name (as generation.OUTPUTS).
TIM_KEYS = {
    "S2L2A": "tok_sen2l2a@224",
    "S1GRD": "tok_sen1grd@224",
    "S1RTC": "tok_sen1rtc@224",
    "DEM": "tok_dem@224",
    "LULC": "tok_lulc@224",
    "NDVI": "tok_ndvi@224",
}
_BY_KEY = {key: name for name, key in TIM_KEYS.items()}
#: The config keys of the TiM arguments.
TIM_ARGS = (
    "backbone_tim_modalities",
    "backbone_tim_chained_generations",
    "backbone_tim_decoding_steps",
    "backbone_tim_temps",
    "backbone_tim_top_p",
    "backbone_tim_top_k",
)


@dataclass(frozen=True)
class TiMOptions:
    """What a TiM backbone generates before its encoder runs, and how it samples.

    Attributes:
        modalities: The generated modalities, geoserve's output names (``LULC``, ``NDVI``,
            ``S2L2A``, ``S1GRD``, ``S1RTC``, ``DEM``), in generation order.
        names: The same, as the config spells them (messages).
        chained: Each generated modality conditions the ones after it.
        temperature: 0 takes the most likely token; otherwise tokens are drawn (see
            :mod:`geoserve.models.terramind.tim`).
        top_p, top_k: Nucleus and top-k filtering before a draw (0: none).
    """

    modalities: tuple[str, ...] = ("LULC",)
    names: tuple[str, ...] = ("LULC",)
    chained: bool = True
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int | float = DEFAULT_TOP_K


def tim_modality(name: str) -> str:
    """The output name of a TiM modality by TerraTorch's naming rules (``lulc`` -> ``LULC``).

    Raises:
        ConfigError: a caption or coordinates (TerraMind's text tokenizer) or an unknown name.
    """
    if name in _BY_KEY:
        return _BY_KEY[name]
    n = (
        name.lower()
        .replace("s2", "sen2")
        .replace("s1", "sen1")
        .replace("text", "caption")
        .replace("location", "coords")
    )
    for part, out in (
        ("sen2", "S2L2A"),
        ("sen1rtc", "S1RTC"),
        ("sen1", "S1GRD"),
        ("dem", "DEM"),
        ("lulc", "LULC"),
        ("ndvi", "NDVI"),
    ):
        if part in n:
            return out
    if "caption" in n or "coords" in n:
        raise ConfigError(
            f"TiM modality {name!r} is generated as text with TerraMind's text tokenizer (from "
            f"the Hugging Face Hub), which geoserve does not run; TiM modalities geoserve "
            f"generates: {', '.join(TIM_KEYS)}"
        )
    raise ConfigError(f"unknown TiM modality {name!r}; TiM modalities: {', '.join(TIM_KEYS)}")


def read_tim_options(
    args: Mapping[str, Any],
    inputs: list[str] | None,
    path: Path | str,
    bad: Callable[[str, str], WeightsError],
) -> TiMOptions:
    """The TiM arguments of a ``terramind_v1_<size>_tim`` config's ``model_args``.

    Raises:
        WeightsError: a value of the wrong type or range (``bad``).
        ConfigError: a TiM modality geoserve does not generate, one named twice, one that is
            also an input by the same name, band subsets, or several decoding steps.
    """
    names = args.get("backbone_tim_modalities", ["LULC"])
    if not isinstance(names, list) or not names or not all(isinstance(m, str) for m in names):
        raise bad("backbone_tim_modalities", "a list of modality names")
    try:
        outs = [tim_modality(m) for m in names]
    except ConfigError as exc:
        raise ConfigError(f"{path}: backbone_tim_modalities: {exc}") from None
    if len(set(outs)) != len(outs):
        raise ConfigError(f"{path}: backbone_tim_modalities names one modality twice: {names}")
    clash = [m for m in names if inputs is not None and m in inputs]
    if clash:  # TerraTorch: "Fallback TiM modalities are currently only supported for ..."
        raise ConfigError(
            f"{path}: {clash[0]} is in both backbone_modalities and backbone_tim_modalities; "
            "TerraTorch's TiM generates only modalities that are not inputs"
        )
    if args.get("backbone_bands") is not None:
        raise ConfigError(
            f"{path}: backbone_bands: a TiM backbone takes its modalities' pretrained bands "
            "only (TerraTorch refuses band subsets for TiM models)"
        )
    chained = args.get("backbone_tim_chained_generations", True)
    if not isinstance(chained, bool):
        raise bad("backbone_tim_chained_generations", "true or false")
    steps = args.get("backbone_tim_decoding_steps", 1)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise bad("backbone_tim_decoding_steps", "a positive integer")
    if steps != 1:
        raise ConfigError(
            f"{path}: backbone_tim_decoding_steps {steps}: TiM decodes every token in one step "
            "(TerraTorch 1.2.13 fails on a second, empty step); use 1"
        )
    temperature = _number(args, "backbone_tim_temps", DEFAULT_TEMPERATURE, bad, 0.0, 1e3)
    top_p = _number(args, "backbone_tim_top_p", DEFAULT_TOP_P, bad, 0.0, 1.0)
    top_k = args.get("backbone_tim_top_k", DEFAULT_TOP_K)
    if isinstance(top_k, bool) or not isinstance(top_k, int | float):
        raise bad("backbone_tim_top_k", "a token count or a fraction of the vocabulary")
    if (isinstance(top_k, int) and top_k < 0) or (isinstance(top_k, float) and not 0 <= top_k <= 1):
        raise bad("backbone_tim_top_k", "a token count >= 0 or a fraction from 0 to 1")
    return TiMOptions(tuple(outs), tuple(names), chained, temperature, top_p, top_k)


def _number(
    args: Mapping[str, Any],
    key: str,
    default: float,
    bad: Callable[[str, str], WeightsError],
    low: float,
    high: float,
) -> float:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad(key, f"a number from {low:g} to {high:g}")
    return float(value)
