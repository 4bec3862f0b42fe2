"""``terramind-v1-tiny-generate`` as a user runs it: no ``--weights``, the published checkpoints
read offline from a Hugging Face Hub cache laid out as huggingface_hub writes it
(tests/hub_cache.py), at their real sizes (the tiny generator, the LULC tokenizer's ViT-B
decoder), on one 192 px patch of an S2 L2A scene.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import rasterio
import torch

from geoserve import Engine
from geoserve.cli import main
from geoserve.models.terramind.generate import RAW_INPUTS
from geoserve.models.terramind.generation import TerraMindGenerator, generator_args
from geoserve.models.terramind.products import LULC_CLASSES
from geoserve.models.terramind.tokenizers import build_tokenizer
from tests.docs_shell import argv_of
from tests.hub_cache import add_file, offline, set_ref
from tests.models.terramind.test_generate_served import write_scene

ORG = "ibm-esa-geospatial"
DOC_COMMAND = (
    "geoserve predict -i S2L2A=s2_l2a.tif -o scene.tif --model terramind-v1-tiny-generate "
    "--output-kind lulc,confidence --seed 7 # scene_lulc.tif, scene_confidence.tif"
)


def _bytes(state: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> tuple[Path, TerraMindGenerator]:
    """A Hub cache holding the tiny generator's and the LULC tokenizer's checkpoints."""
    cache = tmp_path_factory.mktemp("hub")
    torch.manual_seed(0)
    generator = TerraMindGenerator(RAW_INPUTS, ["LULC"], **generator_args("tiny"))
    lulc = build_tokenizer("LULC", encoder=False)
    for repo, name, state in (
        ("TerraMind-1.0-tiny", "TerraMind_v1_tiny.pt", generator.state_dict()),
        ("TerraMind-1.0-Tokenizer-LULC", "TerraMind_Tokenizer_LULC.pt", lulc.state_dict()),
    ):
        add_file(cache, name, _bytes(state), org=ORG, repo=repo)
        set_ref(cache, "main", "1" * 40, org=ORG, repo=repo)
    return cache, generator


def test_the_published_checkpoints_load_from_the_hub_cache(hub, tmp_path, monkeypatch) -> None:
    cache, generator = hub
    offline(monkeypatch, cache)
    scene = write_scene(tmp_path / "s2.tif", 192, 192)
    with Engine("terramind-v1-tiny-generate", output_kind=["lulc"], warmup=False) as engine:
        assert engine.model.outputs == ("LULC",)
        assert torch.equal(engine.model.generator.mask_token, generator.mask_token)
        out = engine.generate_image({"S2L2A": str(scene)}, output_path=tmp_path / "lulc.tif")
    with rasterio.open(out.outputs.path) as dst:
        assert (dst.width, dst.height) == (192, 192)
        assert dst.tags()["CLASS_NAMES"].split(",") == list(LULC_CLASSES)
        assert int(dst.read(1).max()) < len(LULC_CLASSES)


def test_generation_md_command(hub, tmp_path, monkeypatch) -> None:
    """docs/generation.md's first command, as written, in a folder holding its input."""
    offline(monkeypatch, hub[0])
    write_scene(tmp_path / "s2_l2a.tif", 192, 192)
    here = Path.cwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv_of(DOC_COMMAND)) == 0
    finally:
        os.chdir(here)
    with rasterio.open(tmp_path / "scene_lulc.tif") as lulc:
        assert lulc.tags()["GEOSERVE_OUTPUT"] == "lulc"
    with rasterio.open(tmp_path / "scene_confidence.tif") as conf:
        assert conf.dtypes[0] == "float32"
