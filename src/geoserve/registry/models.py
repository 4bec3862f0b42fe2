"""Model registrations: what a model name resolves to.

A model is registered as a *factory* (a class or a function returning a ``torch.nn.Module``).
Its input and output processors are attached with decorators on the same factory; they are keyed
by the factory's qualified name, so the decorators can be stacked in any order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from geoserve.errors import UnknownModelError
from geoserve.processors.base import InputProcessor, OutputProcessor
from geoserve.registry.base import Registry

F = TypeVar("F", bound=Callable[..., Any])


def factory_key(factory: Callable[..., Any]) -> str:
    """The registry key of a model factory: ``module:qualname``."""
    return f"{factory.__module__}:{factory.__qualname__}"


@dataclass(frozen=True)
class ModelSpec:
    """A registered model.

    Attributes:
        name: Public name (CLI ``--model``, requests).
        factory: Builds the ``torch.nn.Module``; called with no arguments (or with the
            weights path when ``loads_weights``).
        description: One line for ``geoserve models``.
        weights_required: Whether the model is useless without ``weights=``.
        weights_hint: Where such weights come from, shown when they are missing.
        loads_weights: The factory takes the weights path itself (``factory(weights)``), for
            models whose checkpoints need their own loader (Prithvi); otherwise the engine
            loads a plain state dict into ``factory()``.
        token_size: Pixels per side of the encoder's patch tokens, for a model whose module
            provides ``forward_with_tokens`` (see :mod:`geoserve.processors.embeddings`): it
            can also produce the ``embeddings`` and ``patch-embeddings`` kinds.
        validated: Speed options (``"int8"``) checked against float32 on real data (its
            model card says how); others are allowed with a warning.
        input_description: What the model takes, in words for a user holding the wrong file
            (``"a 13-band Sentinel-2 L1C stack (B01-B08, B8A, B09-B12, in that order)"``):
            said with a band mismatch, by ``geoserve info`` and models, and ``GET /v1/models``.
        bundled_weights: The weights file a model ships and its factory loads itself, when no
            ``weights=`` are given (its name and sha256 go into a result's STAC Item).
    """

    name: str
    factory: Callable[[], Any]
    description: str = ""
    weights_required: bool = False
    weights_hint: str = ""
    loads_weights: bool = False
    token_size: int | None = None
    validated: tuple[str, ...] = ()
    input_description: str = ""
    bundled_weights: Path | None = None

    @property
    def key(self) -> str:
        """The key its processors are registered under."""
        return factory_key(self.factory)


class ModelRegistry(Registry[ModelSpec]):
    """Registry of :class:`ModelSpec` by public name."""

    def __init__(self) -> None:
        super().__init__("model", not_found=UnknownModelError)

    def register_model(
        self,
        name: str,
        *,
        description: str = "",
        weights_required: bool = False,
        weights_hint: str = "",
        loads_weights: bool = False,
        token_size: int | None = None,
        validated: tuple[str, ...] = (),
        input_description: str = "",
        bundled_weights: Path | None = None,
        override: bool = False,
    ) -> Callable[[F], F]:
        """Decorator registering a model factory under ``name`` (fields as :class:`ModelSpec`)."""

        def decorator(factory: F) -> F:
            doc = description or (factory.__doc__ or "").strip().split("\n")[0]
            spec = ModelSpec(
                name,
                factory,
                doc,
                weights_required,
                weights_hint,
                loads_weights,
                token_size,
                tuple(validated),
                input_description,
                bundled_weights,
            )
            self.add(name, spec, override=override)
            return factory

        return decorator


class InputRegistry(Registry[InputProcessor]):
    """Input processors keyed by model factory."""

    def __init__(self) -> None:
        super().__init__("input processor")

    def register_input_processor(
        self, processor: InputProcessor, *, override: bool = False
    ) -> Callable[[F], F]:
        """Decorator attaching ``processor`` to the decorated model factory."""

        def decorator(factory: F) -> F:
            self.add(factory_key(factory), processor, override=override)
            return factory

        return decorator


class OutputRegistry(Registry[OutputProcessor]):
    """Output processors keyed by model factory."""

    def __init__(self) -> None:
        super().__init__("output processor")

    def register_output_processor(
        self, processor: OutputProcessor, *, override: bool = False
    ) -> Callable[[F], F]:
        """Decorator attaching ``processor`` to the decorated model factory."""

        def decorator(factory: F) -> F:
            self.add(factory_key(factory), processor, override=override)
            return factory

        return decorator
