"""OGC API - Processes (Part 1: Core 1.0) documents: landing page, conformance, the process.

Each served model is one process, named after it. Its description lists the inputs an
execution takes (``image``: one scene, a list of dates, or for a multimodal model an object of
modality name to scene; ``output_kind``, ``bands``, ``dates``; ``seed``, of a generative
model's random draws) and the outputs it can make (one per output kind the model offers), each
with a JSON Schema. A scene is given by reference (``{"href": URL}`` for an allowed host,
``{"href": PATH}`` under an allowed input directory) or inline (``{"value": BASE64,
"mediaType": "image/tiff"}``), under the same trust rules as ``POST /v1/images``.

Outputs are given by reference (download links) unless asked by value: an execute request's
``outputs`` with ``transmissionMode: value``, or ``Prefer: return=representation`` on the
results; then each output of at most ``max_inline_mb`` is inline, in base64.

``oas30`` is not declared: FastAPI serves an OpenAPI 3.1 document (``/openapi.json``), which
the ``oas30`` conformance class does not cover.
"""

from __future__ import annotations

from typing import Any

from geoserve.engine.async_engine import AsyncEngine
from geoserve.seeds import MAX_SEED

_CONF = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/"
#: The conformance classes this server meets (no ``oas30``: see the module docstring).
CONFORMANCE = [
    _CONF + "core",
    _CONF + "ogc-process-description",
    _CONF + "json",
    _CONF + "job-list",
    _CONF + "dismiss",
]

_SCENE: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "required": ["href"],
            "properties": {"href": {"type": "string"}, "type": {"type": "string"}},
        },
        {
            "type": "object",
            "required": ["value"],
            "properties": {
                "value": {"type": "string", "contentEncoding": "base64"},
                "mediaType": {"type": "string"},
            },
        },
    ]
}


def landing(base: str, jobs_on: bool) -> dict[str, Any]:
    """The landing page: links to the API's parts; says whether jobs are on."""
    links = [
        {"href": base, "rel": "self", "type": "application/json", "title": "this document"},
        {
            "href": f"{base}/conformance",
            "rel": "http://www.opengis.net/def/rel/ogc/1.0/conformance",
            "type": "application/json",
        },
        {
            "href": f"{base}/processes",
            "rel": "http://www.opengis.net/def/rel/ogc/1.0/processes",
            "type": "application/json",
        },
        {
            "href": f"{base}/jobs",
            "rel": "http://www.opengis.net/def/rel/ogc/1.0/job-list",
            "type": "application/json",
        },
    ]
    description = "The served model as an OGC API - Processes process."
    if not jobs_on:
        description += " Jobs are off on this server (it was started without --output-dir)."
    return {"title": "geoserve", "description": description, "links": links}


def process_summary(model: str, base: str) -> dict[str, Any]:
    """The process in ``/processes``."""
    return {
        "id": model,
        "title": model,
        "version": "1.0.0",
        "description": f"Run the model {model} over a scene; outputs on the scene's grid.",
        "jobControlOptions": ["async-execute", "sync-execute", "dismiss"],
        "outputTransmission": ["value", "reference"],
        "links": [
            {"href": f"{base}/processes/{model}", "rel": "self", "type": "application/json"},
            {
                "href": f"{base}/processes/{model}/execution",
                "rel": "http://www.opengis.net/def/rel/ogc/1.0/execute",
                "type": "application/json",
            },
        ],
    }


def process_description(model: str, base: str, eng: AsyncEngine) -> dict[str, Any]:
    """The process's full description: inputs from its input processor, outputs by kind."""
    engine = eng.engine
    inp = engine.in_proc
    modalities = getattr(inp, "modalities", None) or ()
    image: dict[str, Any]
    if modalities:
        image = {
            "type": "object",
            "properties": {m.name: _SCENE for m in modalities},
            "required": [m.name for m in modalities if m.required],
        }
        about = "an object of modality name to scene: " + ", ".join(m.name for m in modalities)
    elif inp.num_frames > 1:
        image = {"type": "array", "items": _SCENE, "minItems": 1}
        about = f"the dates of one place, {inp.num_frames} scenes"
    else:
        image = _SCENE
        about = "one scene"
    bands = list(getattr(inp, "bands", None) or [])
    kinds = list(engine.kinds_offered())
    inputs = {
        "image": {
            "title": "input scene",
            "description": f"The input: {about} (href: an allowed URL or path; value: base64)."
            + (f" Bands used: {bands}." if bands else ""),
            "minOccurs": 1,
            "maxOccurs": 1,
            "schema": image,
        },
        "output_kind": {
            "title": "output kinds",
            "description": "The output kinds to make (default: the model's).",
            "minOccurs": 0,
            "maxOccurs": 1,
            "schema": {
                "oneOf": [
                    {"type": "string", "enum": kinds},
                    {"type": "array", "items": {"type": "string", "enum": kinds}},
                ]
            },
        },
        "bands": {
            "title": "bands",
            "description": "Band indices (0-based) or descriptions to feed the model instead.",
            "minOccurs": 0,
            "maxOccurs": 1,
            "schema": {"type": "array", "items": {"type": ["integer", "string"]}},
        },
        "dates": {
            "title": "acquisition dates",
            "description": "ISO 8601 dates, one per scene (for models that take dates).",
            "minOccurs": 0,
            "maxOccurs": 1,
            "schema": {"type": "array", "items": {"type": "string"}},
        },
        "seed": {
            "title": "seed",
            "description": "The seed of a generative model's random draws: the same seed and "
            "inputs give the same output (one-pass models ignore it).",
            "minOccurs": 0,
            "maxOccurs": 1,
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SEED, "default": 0},
        },
    }
    outputs = {
        kind: {
            "title": kind,
            "schema": {
                "type": "string",
                "contentMediaType": "image/tiff; application=geotiff",
                "contentEncoding": "binary",
            },
        }
        for kind in kinds
    }
    return {**process_summary(model, base), "inputs": inputs, "outputs": outputs}
