"""What a model takes, in its own words: in ``GET /v1/models`` and in a 400 for a file that
does not fit (the same words as the command line's error)."""

from __future__ import annotations

import httpx

from tests.conftest import RGB
from tests.server.conftest import running_server

L1C_STACK = "a 13-band Sentinel-2 L1C stack (B01-B08, B8A, B09-B12, in that order)"


def test_demo_water_says_what_it_takes_in_models_and_in_a_400():
    with running_server(model="demo-water", warmup=False) as url:
        listed = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
        resp = httpx.post(
            f"{url}/v1/images", files={"file": (RGB.name, RGB.read_bytes())}, timeout=60
        )
    assert listed["input"]["description"].startswith(L1C_STACK), listed["input"]
    assert resp.status_code == 400, resp.text
    message = resp.json()["message"]
    assert message.startswith(f"upload '{RGB.name}' has 3 bands; band index 3 (0-based)"), message
    assert f"; model 'demo-water' takes {L1C_STACK}" in message
    assert "; it reads bands 1, 2, 3, 8, 11, 12 (0-based) (choose others with --bands" in message
