"""Fixtures shared by the engine's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multimodal_scenes import write_s2

#: The side of the large S2-like scene the streaming tests run (their memory is the point).
LARGE = 8192


@pytest.fixture(scope="session")
def large_s2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8192 x 8192 S2-like scene of :mod:`tests.multimodal_scenes`, written once for the
    session (about 30 s of CPU): the streaming tests of several kinds and of several
    modalities read the same file."""
    return write_s2(tmp_path_factory.mktemp("large-s2") / "s2.tif", LARGE)
