"""TerraMind generation served by the engine (``test-generate``: the real step logic at toy
width, see tests/generate_stub.py): products, reproducibility, options and their refusals.

Scenes are small seeded Sentinel-2 L2A-like GeoTIFFs (12 bands of uint16) on a UTM grid.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from rasterio.transform import from_origin

from geoserve import Engine
from geoserve.cli import main
from geoserve.errors import ConfigError, GeoServeError, WeightsError
from geoserve.models.terramind.generate import RAW_INPUTS, TerraMindGenerate
from geoserve.models.terramind.generation import TerraMindGenerator, generator_args
from geoserve.models.terramind.generation_weights import GenerationFiles
from geoserve.models.terramind.products import LULC_CLASSES
from geoserve.models.terramind.variants import MODALITIES
from tests.generate_stub import TinyParts

KINDS = ["s1grd", "lulc", "confidence"]
S1 = MODALITIES["S1GRD"]


def write_scene(path: Path, height: int = 48, width: int = 40, seed: int = 0, nodata=None) -> Path:
    """A 12-band S2 L2A-like scene; with ``nodata``, its upper-left 8 x 8 pixels are nodata."""
    rng = np.random.default_rng(seed)
    data = rng.integers(200, 4000, (12, height, width)).astype(np.uint16)
    prof = dict(
        driver="GTiff",
        height=height,
        width=width,
        count=12,
        dtype="uint16",
        crs="EPSG:32633",
        transform=from_origin(300000, 5800000, 10, 10),
    )
    if nodata is not None:
        prof["nodata"] = nodata
        data[:, :8, :8] = nodata
    with rasterio.open(path, "w", **prof) as dst:
        dst.write(data)
    return path


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    return write_scene(tmp_path_factory.mktemp("gen") / "s2.tif")


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine("test-generate", output_kind=KINDS, max_batch_patches=16, warmup=False)


def _run(engine: Engine, scene: Path, out: Path, seed: int = 0, **kw) -> dict[str, Path]:
    result = engine.generate_image({"S2L2A": str(scene)}, output_path=out, seed=seed, **kw)
    assert result.error is None, result.error
    return {k: Path(o.path) for k, o in result.outputs_by_kind.items()}


def _bytes(files: dict[str, Path]) -> dict[str, bytes]:
    out = {}
    for kind, path in files.items():
        with rasterio.open(path) as src:
            out[kind] = src.read().tobytes()
    return out


def test_the_plan_follows_the_output_kinds_and_steps() -> None:
    model = TerraMindGenerate(TinyParts())
    model.configure(kinds=["lulc", "dem"], options={"steps": 3}, patch_size=64, stride=32)
    assert model.outputs == ("LULC", "DEM")
    # token passes in the kinds' order, then DEM's diffusion: steps=3 runs 4 UNet calls
    assert model.plan() == ("tokens-lulc", "tokens-dem") + ("denoise-dem",) * 4
    lulc = TerraMindGenerate(TinyParts())
    lulc.configure(kinds=["confidence"], options={}, patch_size=64, stride=32)
    assert lulc.plan() == ("tokens-lulc",)  # LULC alone: one pass, decoded when finished


def test_products_are_on_the_input_grid_in_physical_units(engine, scene, tmp_path) -> None:
    files = _run(engine, scene, tmp_path / "out.tif", seed=1)
    assert {k: p.name for k, p in files.items()} == {
        "s1grd": "out_s1grd.tif",
        "lulc": "out_lulc.tif",
        "confidence": "out_confidence.tif",
    }
    with rasterio.open(scene) as src:
        grid = (src.crs, src.transform, src.width, src.height)
    for path in files.values():
        with rasterio.open(path) as dst:
            assert (dst.crs, dst.transform, dst.width, dst.height) == grid
    with rasterio.open(files["s1grd"]) as dst:
        s1 = dst.read()
        assert dst.descriptions == ("VV", "VH")
        assert dst.tags()["UNITS"] == "dB"
    # the diffusion ends in [-1, 1] standardised units: within one std of the mean, in dB
    for band, mean, std in zip(s1, S1.mean, S1.std, strict=True):
        assert np.isfinite(band).all()
        assert mean - std - 1e-3 <= band.min()
        assert band.max() <= mean + std + 1e-3
        assert band.std() > 0.01  # not a constant image
    with rasterio.open(files["lulc"]) as dst:
        lulc = dst.read(1)
        assert dst.dtypes[0] == "uint8"
        assert dst.nodata == 255
        assert lulc.max() < len(LULC_CLASSES)
        assert dst.tags()["CLASS_NAMES"].split(",") == list(LULC_CLASSES)
        assert len(dst.colormap(1)) >= len(LULC_CLASSES)
    with rasterio.open(files["confidence"]) as dst:
        conf = dst.read(1)
    assert (conf >= 1 / len(LULC_CLASSES) - 1e-6).all()
    assert (conf <= 1).all()


def test_nodata_stays_nodata_in_every_product(engine, tmp_path) -> None:
    scene = write_scene(tmp_path / "holes.tif", nodata=0)
    files = _run(engine, scene, tmp_path / "holes_out.tif")
    with rasterio.open(files["s1grd"]) as dst:
        s1 = dst.read()
    with rasterio.open(files["lulc"]) as dst:
        lulc = dst.read(1)
    assert np.isnan(s1[:, :8, :8]).all()
    assert np.isfinite(s1[:, 8:, 8:]).all()
    assert (lulc[:8, :8] == 255).all()
    assert (lulc[8:, 8:] < 255).all()


def test_a_seed_gives_the_same_bytes_in_any_batch_and_company(engine, scene, tmp_path) -> None:
    """Same request: alone at batch 1, among three others at batch 16, and again: same
    bytes; another seed: another S1 image and another sample of land cover."""
    alone = Engine("test-generate", output_kind=KINDS, max_batch_patches=1, warmup=False)
    first = _bytes(_run(alone, scene, tmp_path / "alone.tif", seed=7))
    others = [write_scene(tmp_path / f"o{i}.tif", 24 + 8 * i, 32, seed=i) for i in range(3)]
    ids = [
        engine.add_request({"S2L2A": str(p)}, output_path=tmp_path / f"o{i}_out.tif", seed=i)
        for i, p in enumerate(others)
    ]
    ids.append(engine.add_request({"S2L2A": str(scene)}, output_path=tmp_path / "busy.tif", seed=7))
    done = {r.request_id: r for r in engine.run_until_done()}
    assert all(done[i].error is None for i in ids)
    busy = {k: Path(o.path) for k, o in done[ids[-1]].outputs_by_kind.items()}
    assert _bytes(busy) == first
    other = _bytes(_run(engine, scene, tmp_path / "seed8.tif", seed=8))
    assert other["s1grd"] != first["s1grd"]
    assert other["lulc"] != first["lulc"]


def test_temperature_zero_takes_the_most_likely_tokens(scene, tmp_path) -> None:
    """At temperature 0 the tokens do not depend on the seed (the land cover neither); the
    diffusion's noise still does."""
    eng = Engine("test-generate", output_kind=["s1grd", "lulc"], temperature=0.0, warmup=False)
    a = _bytes(_run(eng, scene, tmp_path / "t0a.tif", seed=1))
    b = _bytes(_run(eng, scene, tmp_path / "t0b.tif", seed=2))
    assert a["lulc"] == b["lulc"]
    assert a["s1grd"] != b["s1grd"]


def test_a_request_for_what_the_engine_does_not_generate_fails_alone(
    engine, scene, tmp_path
) -> None:
    with pytest.raises(
        GeoServeError, match=r"cannot produce 'dem'.*offers s1grd, lulc, confidence"
    ):
        engine.generate_image(
            {"S2L2A": str(scene)}, output_path=tmp_path / "x.tif", output_kind="dem"
        )
    files = _run(engine, scene, tmp_path / "after.tif", output_kind="lulc")  # the engine goes on
    assert set(files) == {"lulc"}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"patch_size": 64, "stride": 40}, "token grid.*stride \\(40\\)"),
        ({"patch_size": 80, "stride": 48}, "multiple of 32"),
        ({"output_kind": ["classes"]}, "cannot produce 'classes'"),
        ({"steps": 0}, "steps"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_generation_settings_are_refused_at_start(options, match) -> None:
    with pytest.raises(ConfigError, match=match):
        Engine("test-generate", warmup=False, **options)


def test_a_one_pass_model_refuses_generation_options() -> None:
    with pytest.raises(ConfigError, match="'identity' does not generate: temperature"):
        Engine("identity", temperature=0.5, warmup=False)


def test_the_command_line_generates_each_kind(scene, tmp_path) -> None:
    out = tmp_path / "cli.tif"
    argv = ["predict", "-i", f"S2L2A={scene}", "-o", str(out), "-m", "test-generate"]
    argv += ["--output-kind", "s1grd,lulc", "--steps", "1", "--temperature", "0", "--no-warmup"]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, stderr.getvalue()
    for kind in ("s1grd", "lulc"):
        with rasterio.open(tmp_path / f"cli_{kind}.tif") as dst:
            assert dst.tags()["GEOSERVE_OUTPUT"] == kind
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_:
        main([*argv[:-5], "--top-p", "2"])
    assert exit_.value.code == 2
    assert "--top-p" in stderr.getvalue()
    assert "Traceback" not in stderr.getvalue()


# -- weights -----------------------------------------------------------------------------------


def test_a_weights_directory_names_the_file_it_lacks(tmp_path) -> None:
    with pytest.raises(WeightsError, match=r"no TerraMind_v1_tiny\.pt in it"):
        GenerationFiles("tiny", tmp_path).generator(RAW_INPUTS, ["LULC"])
    with pytest.raises(WeightsError, match=r"no TerraMind_Tokenizer_LULC\.pt in it"):
        GenerationFiles("tiny", tmp_path).tokenizer("LULC")
    with pytest.raises(ConfigError, match="unknown TerraMind v1 variant"):
        GenerationFiles("huge", tmp_path)


def test_a_terratorch_state_dict_loads_the_generator_strictly(tmp_path) -> None:
    """TerraTorch's ``TerraMindGeneration`` layout (``sampler.model.*``): the generator comes
    out equal; its missing tokenizer is an error naming the prefix."""
    torch.manual_seed(0)
    ref = TerraMindGenerator(RAW_INPUTS, ["LULC"], **generator_args("tiny"))
    path = tmp_path / "generation.pt"
    torch.save({f"sampler.model.{k}": v for k, v in ref.state_dict().items()}, path)
    files = GenerationFiles("tiny", path)
    got = files.generator(RAW_INPUTS, ["LULC"])
    for key, value in ref.state_dict().items():
        assert torch.equal(got.state_dict()[key], value), key
    with pytest.raises(WeightsError, match="tokenizer.tok_lulc@224"):
        files.tokenizer("LULC")


def test_a_request_sets_its_own_sampling(engine, scene, tmp_path) -> None:
    """temperature/top_p/top_k per request: its own, mixed in batches with requests on the
    engine's defaults, and the same bytes as an engine configured that way."""
    at_zero = Engine("test-generate", output_kind=KINDS, temperature=0.0, warmup=False)
    want = _bytes(_run(at_zero, scene, tmp_path / "z.tif", seed=3))
    ids = [
        engine.add_request(
            {"S2L2A": str(scene)}, output_path=tmp_path / f"r{i}.tif", seed=3, temperature=t
        )
        for i, t in enumerate((0.0, None))
    ]
    done = {r.request_id: r for r in engine.run_until_done()}
    got = [_bytes({k: Path(o.path) for k, o in done[i].outputs_by_kind.items()}) for i in ids]
    assert got[0] == want
    assert got[1]["lulc"] != want["lulc"]  # the engine's temperature 1.0 samples
    with pytest.raises(ConfigError, match=r"temperature: should be greater than or equal to 0"):
        engine.generate_image({"S2L2A": str(scene)}, temperature=-1.0)
    with pytest.raises(ConfigError, match=r"'identity' does not generate: top_p"):
        Engine("identity", warmup=False).generate_image(str(scene), top_p=0.5)


def test_an_engine_without_land_cover_generates_what_it_names(scene, tmp_path) -> None:
    """The model's own default kind (lulc) is no demand: an engine of s1grd alone starts."""
    eng = Engine("test-generate", output_kind=["s1grd"], warmup=False)
    assert eng.model.plan() == ("tokens-s1grd", "denoise-s1grd", "denoise-s1grd")
    assert set(_run(eng, scene, tmp_path / "s1.tif")) == {"s1grd"}


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"temperature": "0.5"}, "temperature: should be a number"),
        ({"temperature": True}, "temperature: should be a number"),
        ({"top_k": 10**30}, "top_k: should be less than or equal to 1000000"),
    ],
)
def test_bad_request_sampling_fails_that_request(engine, scene, option, match) -> None:
    with pytest.raises(ConfigError, match=match):
        engine.generate_image({"S2L2A": str(scene)}, **option)


def test_quantizing_a_generative_model_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="--quantize int8 is not supported"):
        Engine("test-generate", quantize="int8", warmup=False)
