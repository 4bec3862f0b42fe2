"""What ``GET /v1/models`` says of the served model: its processors, output kinds, runtime."""

from __future__ import annotations

from typing import Any

from geoserve.engine.shared_weights import resident_bytes


def model_entry(model: str, eng: Any) -> dict[str, Any]:
    """The served model's entry (``eng``: its ``AsyncEngine``, None while it loads)."""
    entry: dict[str, Any] = {
        "id": model,
        "object": "model",
        "owned_by": "geoserve",
        "ready": eng is not None,
    }
    if eng is not None:
        inp, out = eng.engine.in_proc, eng.engine.out_proc
        entry["input"] = {
            "description": eng.engine.spec.input_description or None,  # what it takes, in words
            "bands": list(getattr(inp, "bands", None) or []) or None,
            "patch_size": inp.patch_size,
            "stride": inp.stride,
            "blend": inp.blend,
            "num_frames": inp.num_frames,
        }
        modalities = getattr(inp, "modalities", None)
        if modalities:  # a multimodal model: what each key of "data" may be
            entry["input"]["modalities"] = [
                {
                    "name": m.name,
                    "bands": list(m.bands) if m.bands is not None else None,
                    "required": m.required,
                    "resampling": m.resampling,
                    "num_frames": m.num_frames,
                }
                for m in modalities
            ]
            entry["input"]["reference"] = getattr(inp, "reference", None)
        entry["output"] = {
            "kind": out.kind,
            "kinds": [getattr(p, "kind", "raw") for p in eng.engine.out_procs],
            "available_kinds": list(eng.engine.kinds_offered()),
            "classes": list(getattr(out, "classes", ())),
            "colors": [list(c) for c in getattr(out, "colors", None) or ()],
        }
        cfg = eng.engine.config
        entry["runtime"] = {  # how it runs: the speed options, and which were validated
            "device": str(eng.engine.device),
            "dtype": cfg.dtype,
            "quantize": cfg.quantize,
            "compile": cfg.compile,
            "validated": list(eng.engine.spec.validated),
            "backend": cfg.backend,
            "precision": cfg.precision or "fp32",
            # its weights and buffers (the part shared with another model included)
            "weights_mb": round(resident_bytes([eng.engine.model]) / 2**20, 1),
        }
        shared = getattr(eng.engine, "shared_parts", ())
        if shared:  # parts held once with another served model (equal weights)
            entry["runtime"]["shared_weights"] = {
                "parts": [p.path for p in shared],
                "mb": round(sum(p.bytes for p in shared) / 2**20, 1),
            }
        converted = getattr(eng.engine.runner, "runtime", {}).get("converted", [])
        if converted:  # the backend's converted models and their accuracy figures
            entry["runtime"]["converted"] = [
                {k: v for k, v in c.items() if k != "path"}
                for c in converted  # (no server paths)
            ]
    return entry
