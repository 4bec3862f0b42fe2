"""Models registered from a TerraTorch fine-tune config and a checkpoint, without code.

One function registers such a model, :func:`register_configured`; the command line
(``predict --config-file``, ``--register NAME=CONFIG,WEIGHTS``, ``--models-dir``) and the
server (``models_dir``) all go through it. The model's input processor comes from the config's
data section (bands, scale, means, stds) and tiling, its output processor is a class map of the
config's classes, and its factory builds the network and loads the checkpoint strictly: a
timm / SMP encoder-decoder (:mod:`geoserve.models.encoder_decoder`), or TerraMind when the
config's backbone is ``terramind_*`` (:mod:`geoserve.models.terramind.configured`). Which of
them, and how each is built, is decided in one place:
:func:`geoserve.models.families.serve_config`.

A models directory holds one sub-directory per model, named after it::

    models/
      burn-scars/config.yaml  burn-scars/best.ckpt
      floods/config.yaml      floods/floods.pt

(each: ``config.yaml`` or ``config.yml``, and exactly one checkpoint: ``.ckpt``, ``.pt``,
``.pth`` or ``.safetensors``). Paths come from the operator, who is trusted; they are checked
to exist and errors name them. The config file itself is read as untrusted data.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geoserve.errors import ConfigError, GeoServeError, RegistryError, prefixed
from geoserve.models.families import Served, serve_config

if TYPE_CHECKING:  # (listing a models directory does not import torch)
    from geoserve.registry import ModelSpec

#: What a model's name may be: it is typed on command lines and sent in requests.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".safetensors")
CONFIG_NAMES = ("config.yaml", "config.yml")
#: Most models one directory may register.
MAX_DIR_MODELS = 256

_lock = threading.Lock()
_registered: dict[str, tuple[Path, Path | None]] = {}


@dataclass(frozen=True)
class Configured:
    """A model to register: its name, config file and checkpoint (None: given at run time)."""

    name: str
    config: Path
    weights: Path | None = None


def register_configured(
    name: str, config: str | Path, weights: str | Path | None = None
) -> ModelSpec:
    """Register the fine-tune ``config`` describes under ``name``.

    ``weights``: its checkpoint; None means it is given when the model is loaded (``--weights``).
    Registering the same name with the same files again does nothing.

    Raises:
        ConfigError: an invalid name, or a config or checkpoint that does not exist.
        RegistryError: ``name`` is taken by another model.
        WeightsError: the config cannot be read or describes a network geoserve does not build.
    """
    from geoserve.plugins import load_plugins
    from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(
            f"invalid model name {name!r}: use letters, digits, '.', '_' and '-' (at most 64, "
            "starting with a letter or digit)"
        )
    cfg = _existing(config, "config file")
    ckpt = _existing(weights, "checkpoint") if weights is not None else None
    load_plugins()  # a name a plugin registers is taken now, not when the plugin loads later
    with _lock:
        if _registered.get(name) == (cfg, ckpt):
            return MODEL_REGISTRY.get(name)
        if name in MODEL_REGISTRY:
            raise RegistryError(f"model {name!r} is already registered; choose another name")
        served = serve_config(cfg)
        factory = _factory(name, cfg, ckpt, served)
        MODEL_REGISTRY.register_model(
            name,
            description=f"TerraTorch fine-tune {cfg.name}: {served.description}",
            weights_required=ckpt is None,
            weights_hint=f"the checkpoint of the fine-tune {cfg} describes",
            loads_weights=True,
            token_size=served.token_size,
        )(factory)
        INPUT_REGISTRY.register_input_processor(served.input)(factory)
        OUTPUT_REGISTRY.register_output_processor(served.output)(factory)
        _registered[name] = (cfg, ckpt)
        return MODEL_REGISTRY.get(name)


def unregister_configured(name: str) -> None:
    """Remove a configured model and its processors (tests, reloads); unknown names: nothing."""
    from geoserve.registry import INPUT_REGISTRY, MODEL_REGISTRY, OUTPUT_REGISTRY

    with _lock:
        if _registered.pop(name, None) is None:
            return
        spec = MODEL_REGISTRY.remove(name)
        INPUT_REGISTRY.remove(spec.key)
        OUTPUT_REGISTRY.remove(spec.key)


def _factory(name: str, config: Path, weights: Path | None, served: Served) -> Any:
    """The one factory of a configured model: its family's loader, on the checkpoint given."""

    def factory(given: str | Path | None = None) -> Any:
        path = given if given is not None else weights
        assert path is not None  # the engine asks for weights when none were registered
        return served.load(Path(path))

    factory.__qualname__ = f"configured[{name}]"  # its processors' key: one per model
    factory.__doc__ = f"{name}: {served.description}"
    factory.configured_files = (config, weights)  # type: ignore[attr-defined]
    return factory


def _existing(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not str(path).strip() or not p.is_file():
        raise ConfigError(f"{path}: {what} not found")
    return p.resolve()


def parse_registration(text: str) -> Configured:
    """``NAME=CONFIG.yaml,WEIGHTS.ckpt`` (the weights may be left out: ``NAME=CONFIG.yaml``).

    Raises:
        ConfigError: not of that form.
    """
    name, sep, files = text.partition("=")
    parts = files.split(",") if sep else []
    if not sep or not name.strip() or not 1 <= len(parts) <= 2 or not parts[0].strip():
        raise ConfigError(
            f"--register {text!r}: expected NAME=CONFIG.yaml,WEIGHTS.ckpt (or NAME=CONFIG.yaml)"
        )
    weights = Path(parts[1].strip()) if len(parts) == 2 and parts[1].strip() else None
    return Configured(name.strip(), Path(parts[0].strip()), weights)


def models_in_dir(directory: str | Path) -> list[Configured]:
    """The models of a models directory (see the module docstring), by name; nothing loaded.

    Raises:
        ConfigError: the directory does not exist, or a sub-directory lacks its config or has
            no checkpoint, or several.
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{directory}: models directory not found")
    found = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config = next((sub / n for n in CONFIG_NAMES if (sub / n).is_file()), None)
        if config is None:
            raise ConfigError(f"{sub}: no {' or '.join(CONFIG_NAMES)} (one model per directory)")
        ckpts = sorted(
            p for p in sub.iterdir() if p.is_file() and p.suffix.lower() in CHECKPOINT_SUFFIXES
        )
        if len(ckpts) != 1:
            names = ", ".join(p.name for p in ckpts) or "none"
            raise ConfigError(
                f"{sub}: needs exactly one checkpoint ({', '.join(CHECKPOINT_SUFFIXES)}), "
                f"found {names}"
            )
        found.append(Configured(sub.name, config, ckpts[0]))
        if len(found) > MAX_DIR_MODELS:
            raise ConfigError(f"{root}: more than {MAX_DIR_MODELS} models")
    return found


def register_all(models: list[Configured]) -> list[str]:
    """Register each of ``models`` (:func:`register_configured`); their names.

    Raises:
        ConfigError, RegistryError, WeightsError: as :func:`register_configured`, naming the
            model.
    """
    for model in models:
        try:
            register_configured(model.name, model.config, model.weights)
        except GeoServeError as exc:
            raise prefixed(exc, f"model {model.name!r}") from exc
    return [m.name for m in models]
