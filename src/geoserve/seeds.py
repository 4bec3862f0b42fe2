"""A request's seed: the one bound every front checks it against (no torch imported here).

A generative model draws every random number of a request from its seed (see
:mod:`geoserve.models.steps`): the same seed and inputs give the same output. A seed is an
integer from 0 to :data:`MAX_SEED` (a signed 64-bit integer), never a boolean. The request spec
(:class:`~geoserve.engine.request_spec.RequestSpec`), the HTTP API's ``options.seed``, the OGC
process's ``seed`` input, ``geoserve.Client``, ``predict --seed`` and Ray's ``run_batch`` all
refuse anything else with a message naming the field.
"""

from __future__ import annotations

#: The largest seed a request may give.
MAX_SEED = 2**63 - 1
#: What a seed must be, in messages.
SEED_RANGE = "an integer from 0 to 2**63 - 1"


def is_seed(value: object) -> bool:
    """Whether ``value`` is a seed: an ``int`` (not a ``bool``) from 0 to :data:`MAX_SEED`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED
