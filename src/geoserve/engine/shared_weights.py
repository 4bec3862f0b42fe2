"""Identical weights held once: submodules equal by content shared between loaded models.

Fine-tunes of one foundation model often keep its encoder frozen (TerraTorch's
``freeze_backbone``), so three such fine-tunes hold three identical copies of the encoder's
weights and differ only in their heads. When a model is loaded, :func:`share_identical` hashes
each of its submodules' tensors (names, dtypes, shapes, devices and bytes: content, never
names of files or models) and, top-down, replaces a submodule equal to one that another loaded
model already holds by that one, so its copy is freed. Inference never writes to a module's
weights or buffers (the models run in eval mode under ``torch.inference_mode``), so a shared
submodule gives each model exactly what its own copy would.

The table of loaded submodules keeps only weak references: a submodule leaves it when no
loaded model uses it any more (an unloaded model's head, say). Submodules smaller than
:data:`MIN_SHARED_BYTES` are not shared (nothing worth saving).
"""

from __future__ import annotations

import hashlib
import threading
import types
import weakref
from dataclasses import dataclass

import torch

#: Submodules with fewer bytes of weights and buffers than this are left alone.
MIN_SHARED_BYTES = 64 * 1024

_lock = threading.Lock()
_loaded: weakref.WeakValueDictionary[str, torch.nn.Module] = weakref.WeakValueDictionary()
#: The one model loaded while no other is (not hashed until a second one loads).
_unhashed: list[weakref.ReferenceType[torch.nn.Module]] = []


@dataclass(frozen=True)
class SharedPart:
    """A submodule of a model replaced by an identical one already loaded."""

    path: str  # where in the model ("encoder", "backbone.blocks"; "" the whole module)
    bytes: int  # bytes of weights and buffers it no longer holds a copy of


def share_identical(module: torch.nn.Module) -> list[SharedPart]:
    """Replace ``module``'s submodules identical to loaded ones by those; record the rest.

    Top-down: a submodule that matches is replaced whole (its children are not looked at);
    one that does not is recorded for models loaded later, and its children are looked at.

    Returns:
        What was shared, and how many bytes each part saved.
    """
    shared: list[SharedPart] = []
    with _lock:
        earlier = [m for ref in _unhashed if (m := ref()) is not None]
        _unhashed.clear()
        if not earlier and not len(_loaded):  # (the first model: hashed when a second loads)
            _unhashed.append(weakref.ref(module))
            return shared
        for m in earlier:
            _visit(m, "", _tensor_digests(m), [])
        _visit(module, "", _tensor_digests(module), shared)
    return shared


def _visit(
    module: torch.nn.Module, path: str, digests: dict[int, str], shared: list[SharedPart]
) -> None:
    for name, child in list(module.named_children()):
        where = f"{path}.{name}" if path else name
        size = _bytes(child)
        if size < MIN_SHARED_BYTES:
            continue
        key = _module_key(child, digests)
        if key is None:  # (hooks, or state that cannot be compared: its children may be)
            _visit(child, where, digests, shared)
            continue
        other = _loaded.get(key)
        if other is not None and other is not child:
            module.register_module(name, other)  # (child's own tensors are let go)
            shared.append(SharedPart(where, size))
            continue
        _loaded[key] = child
        _visit(child, where, digests, shared)


def resident_bytes(modules: list[torch.nn.Module]) -> int:
    """Bytes of the weights and buffers ``modules`` hold together.

    Each tensor's memory counts once: a part shared between them, or tied within one.
    """
    seen: dict[tuple[str, int], int] = {}
    for module in modules:
        for _, t in _tensors(module):
            storage = t.untyped_storage()
            seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def _tensors(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]


def _bytes(module: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for _, t in _tensors(module):
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _tensor_digests(module: torch.nn.Module) -> dict[int, str]:
    """Each tensor's content hash, by the tensor's id (each tensor hashed once)."""
    digests: dict[int, str] = {}
    for _, t in _tensors(module):
        if id(t) in digests:
            continue
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{t.dtype}|{tuple(t.shape)}|{t.device}|{t.requires_grad}".encode())
        try:
            data = t.detach().contiguous()
            if data.device.type != "cpu":
                data = data.cpu()
            if data.numel():
                h.update(data.reshape(-1).view(torch.uint8).numpy().data)
        except (RuntimeError, TypeError, NotImplementedError):  # (meta, sparse, quantised...)
            digests[id(t)] = f"unhashable:{id(t)}"  # (never equal to another's: not shared)
            continue
        digests[id(t)] = h.hexdigest()
    return digests


#: What ``torch.nn.Module.__init__`` sets on every module (the rest is the module's own state).
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def _module_key(module: torch.nn.Module, digests: dict[int, str]) -> str | None:
    """A submodule's identity by content, or None if it must not be shared.

    Its class, and for it and every module under it the class and its own attributes (an
    encoder's ``out_indices``, say: two encoders equal in weights but not in what they return
    are different), then every tensor's hash. A module with hooks, or with an attribute whose
    value cannot be compared by content, is never shared.
    """
    h = hashlib.blake2b(digest_size=20)
    for sub_name, sub in module.named_modules(remove_duplicate=False):
        hooks = [v for k, v in vars(sub).items() if k.endswith("hooks") and v]
        if hooks:
            return None
        state = {k: v for k, v in vars(sub).items() if k not in _MODULE_INTERNALS}
        plain = _plain(state)
        if plain is None:
            return None
        kind = f"{type(sub).__module__}.{type(sub).__qualname__}"
        h.update(f"|m:{sub_name}:{kind}:{plain}".encode())
    for name, t in _tensors(module):
        h.update(f"|t:{name}:{digests[id(t)]}".encode())
    return h.hexdigest()


def _plain(value: object, depth: int = 0) -> str | None:
    """``value`` written out by content (None: it holds something that cannot be).

    Plain values, containers of them, classes and named functions, and objects whose own
    attributes are all of these (timm's ``FeatureInfo``, say), at most 8 levels deep.
    """
    if depth > 8:
        return None
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if isinstance(value, (torch.dtype, torch.device, torch.Size)):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_plain(v, depth + 1) for v in value]
        if any(i is None for i in items):
            return None
        if isinstance(value, (set, frozenset)):
            items = sorted(items)  # type: ignore[type-var]
        return f"{type(value).__name__}({','.join(items)})"  # type: ignore[arg-type]
    if isinstance(value, dict):
        pairs = [(_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in pairs):
            return None
        return "{" + ",".join(sorted(f"{k}:{v}" for k, v in pairs)) + "}"
    if isinstance(value, (type, types.BuiltinFunctionType)) or (
        isinstance(value, types.FunctionType)
        and value.__closure__ is None
        and value.__name__ != "<lambda>"
    ):  # (a class or a named function: the same name is the same code)
        return f"<{value.__module__}.{value.__qualname__}>"
    if callable(value):  # (a lambda, a closure, a bound method, a partial...: not compared)
        return None
    if isinstance(value, torch.nn.Module | torch.Tensor) or not hasattr(value, "__dict__"):
        return None  # (a module or tensor held as a plain attribute: not compared)
    state = _plain(vars(value), depth + 1)
    kind = type(value)
    return None if state is None else f"<{kind.__module__}.{kind.__qualname__}{state}>"
