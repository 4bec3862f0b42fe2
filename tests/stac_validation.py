"""Validating STAC Items without a network: pystac's validator, schemas from the repository.

pystac ships the core schemas (the Item, GeoJSON); the extensions' schemas are in
``tests/data/stac_schemas`` (where they come from: ``tests/data/README.md``). An Item declaring
an extension whose schema is not there fails here, before anything could be fetched.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pystac
from pystac.validation import JsonSchemaSTACValidator

SCHEMAS = Path(__file__).with_name("data") / "stac_schemas"


def offline_validator() -> JsonSchemaSTACValidator:
    """pystac's JSON-schema validator with every vendored extension schema in its cache."""
    validator = JsonSchemaSTACValidator()
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text())
        validator.schema_cache[schema["$id"].rstrip("#")] = schema
    return validator


def validate_offline(item: pystac.Item | dict[str, Any]) -> list[str]:
    """Validate ``item`` (an Item or its JSON) against the core and every extension it declares.

    Returns the schema URIs it was validated against; raises pystac's
    ``STACValidationError`` for an invalid Item.
    """
    if isinstance(item, dict):
        item = pystac.Item.from_dict(item, preserve_dict=False)
    validator = offline_validator()
    cached = set(validator.schema_cache)
    missing = [uri for uri in item.stac_extensions if uri not in cached]
    assert not missing, f"no vendored schema for {missing} (add it to {SCHEMAS})"
    uris: list[str] = item.validate(validator=validator)
    assert set(validator.schema_cache) == cached, "a schema was fetched"
    return uris
