"""The multimodal patcher: what the model's forward receives, required and optional
modalities, the reference grid, and clear errors for requests that do not fit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from rasterio.warp import Resampling, reproject

from geoserve import Engine
from geoserve.errors import BandMismatchError, ConfigError, InputError
from geoserve.processors import Modality, MultimodalPatcher, RawReassembler
from tests.multimodal_scenes import write_s1, write_s2

SIZE = 128


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("mm")
    s2 = write_s2(root / "s2.tif", SIZE)
    with rasterio.open(s2, "r+") as dst:  # clouds masked upstream: a nodata block
        dst.write(np.zeros((4, 20, 30), np.uint16), window=rasterio.windows.Window(10, 10, 30, 20))
        # and one outside the S1 footprint
        dst.write(
            np.zeros((4, 20, 20), np.uint16), window=rasterio.windows.Window(100, 100, 20, 20)
        )
    return str(s2), str(write_s1(root / "s1.tif", SIZE))


class Echo(torch.nn.Module):
    """Returns B8 of s2 (NaN-free: required) and VV of s1 where given, else -1; records what
    it was given."""

    seen: list[dict[str, tuple[int, ...]]] = []

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        Echo.seen.append({k: tuple(v.shape) for k, v in x.items()})
        s2 = x["s2"] if "s2" in x else torch.full_like(x["s1"][:, :1], -1.0)
        s1 = x["s1"][:, :1] if "s1" in x else torch.full_like(s2[:, :1], -1.0)
        return torch.cat([s2[:, :1], s1], dim=1)


def _proc(s2_required: bool = True, **kwargs: object) -> MultimodalPatcher:
    return MultimodalPatcher(
        modalities=(
            Modality(
                "s2", bands=("B8",), scale_factor=1e-4, required=s2_required, fill=float("nan")
            ),  # fmt: skip
            Modality("s1", bands=("VV", "VH"), required=False, fill=float("nan")),
        ),
        **{"patch_size": 32, **kwargs},  # type: ignore[arg-type]
    )


@pytest.fixture
def echo(register_model: Callable[..., str]) -> Callable[..., str]:
    """Registers an Echo model with ``_proc(**kwargs)`` for this test; returns its name."""
    serial = iter(range(100))

    def make(**kwargs: object) -> str:
        n = next(serial)
        # a class of its own per registration (processors are keyed by qualified name)
        factory = type(f"Echo{n}", (Echo,), {"__qualname__": f"Echo{n}"})
        return register_model(f"echo-{n}", factory, _proc(**kwargs), RawReassembler())

    return make


def _run(model: str, inputs: object, **config: object) -> np.ndarray:
    eng = Engine(model, **config)
    Echo.seen.clear()  # (after the warm-up pass)
    out = eng.generate_image(inputs, out_format="tensor")
    return out.outputs.tensor.numpy()


def _reprojected_vv(s1: str, s2: str) -> np.ndarray:
    with rasterio.open(s1) as src, rasterio.open(s2) as ref:
        out = np.full((ref.height, ref.width), np.nan, np.float32)
        reproject(rasterio.band(src, 1), out, dst_transform=ref.transform, dst_crs=ref.crs,
                  dst_nodata=np.nan, resampling=Resampling.bilinear)  # fmt: skip
    return out


def test_forward_gets_a_dict_of_patches_on_the_reference_grid(echo, scenes):
    s2, s1 = scenes
    model = echo()
    got = _run(model, {"s2": s2, "s1": s1}, max_batch_patches=4)
    assert Echo.seen
    assert all(s == {"s2": (s["s2"][0], 1, 32, 32), "s1": (s["s2"][0], 2, 32, 32)}
               for s in Echo.seen)  # fmt: skip
    with rasterio.open(s2) as src:
        b8 = src.read(4)
    s2_valid = b8 != 0
    # s2 required: its nodata block is nodata in the output (NaN), whatever s1 holds
    assert np.isnan(got[:, ~s2_valid]).all()
    np.testing.assert_array_equal(got[0][s2_valid], (b8[s2_valid] * np.float32(1e-4)))
    vv = _reprojected_vv(s1, s2)
    covered = s2_valid & np.isfinite(vv)
    np.testing.assert_allclose(got[1][covered], vv[covered], atol=0.15)
    assert np.isnan(got[1][s2_valid & np.isnan(vv)]).all()  # outside S1: filled with NaN


def test_optional_modality_left_out_is_absent(echo, scenes):
    s2, _ = scenes
    model = echo()
    got = _run(model, {"s2": s2})
    assert all(set(s) == {"s2"} for s in Echo.seen)
    assert np.all(got[1][np.isfinite(got[1])] == -1.0)


def test_with_no_required_modality_pixels_are_nodata_only_where_all_are(echo, scenes):
    s2, s1 = scenes
    got = _run(echo(s2_required=False), {"s2": s2, "s1": s1})
    vv = _reprojected_vv(s1, s2)
    with rasterio.open(s2) as src:
        s2_valid = src.read(4) != 0
    both_missing = ~s2_valid & np.isnan(vv)
    assert both_missing.any()
    assert np.isnan(got[:, both_missing]).all()
    only_s1 = ~s2_valid & np.isfinite(vv)
    assert only_s1.any()
    assert np.isfinite(got[1][only_s1]).all()  # the model saw S1 under the S2 gap
    assert np.isnan(got[0][only_s1]).all()  # and NaN (the fill) for S2 there


def test_results_do_not_depend_on_batch_size_or_streaming(echo, scenes):
    s2, s1 = scenes
    model = echo()
    first = _run(model, {"s2": s2, "s1": s1}, max_batch_patches=1)
    for config in ({"max_batch_patches": 7}, {"streaming": False, "prefetch": False}):
        np.testing.assert_array_equal(_run(model, {"s1": s1, "s2": s2}, **config), first)


def test_reference_and_fixed_grid(echo, scenes):
    s2, s1 = scenes
    with rasterio.open(s1) as src:
        s1_crs, s1_size = src.crs, (src.height, src.width)
    out = Engine(echo(reference="s1")).generate_image({"s2": s2, "s1": s1}, out_format="tensor")
    assert out.outputs.tensor.shape[1:] == s1_size  # the output is on S1's grid
    fixed = echo(crs="EPSG:32633", resolution=40.0)
    path = Engine(fixed).generate_image({"s2": s2, "s1": s1}).outputs.path
    with rasterio.open(path) as dst:
        assert dst.crs.to_epsg() == 32633
        assert dst.res == (40.0, 40.0)
        assert abs(dst.width - SIZE / 4) <= 1
    assert s1_crs.to_epsg() == 4326


@pytest.mark.parametrize(
    ("inputs", "error", "needle"),
    [
        ({"s1": "S1"}, InputError, "modality 's2' is missing; this model needs s2 (optional: s1)"),
        ({"s2": "S2", "dem": "S1"}, InputError, "unknown modality 'dem'; this model takes s2, s1"),
        ({"s2": ["S2", "S2"]}, InputError, "modality 's2': 2 date(s) given; the model takes 1"),
        ({}, InputError, "empty dict of modalities"),
    ],
)
def test_requests_that_do_not_fit_are_named(echo, scenes, inputs, error, needle):
    s2, s1 = scenes
    real = {
        k: [s2 if x == "S2" else s1 for x in v]
        if isinstance(v, list)
        else (s2 if v == "S2" else s1)
        for k, v in inputs.items()
    }
    with pytest.raises(error) as info:
        Engine(echo()).generate_image(real)
    assert needle in str(info.value)


def test_a_missing_band_names_the_modality(echo, scenes):
    s2, s1 = scenes
    eng = Engine(echo(), bands=["B12"])  # --bands: the first modality's bands
    with pytest.raises(BandMismatchError, match="modality 's2'.*no band named 'B12'"):
        eng.generate_image({"s2": s2, "s1": s1})


def test_bad_declarations_are_config_errors():
    with pytest.raises(ConfigError, match="declared twice"):
        MultimodalPatcher(modalities=(Modality("a"), Modality("a")))
    with pytest.raises(ConfigError, match="reference modality 'c'"):
        MultimodalPatcher(modalities=(Modality("a"),), reference="c")
    with pytest.raises(ConfigError, match="invalid modality name"):
        Modality("s 2")
    with pytest.raises(ConfigError, match="invalid resampling"):
        Modality("a", resampling="lanczos")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="modality 'a'.*std"):
        MultimodalPatcher(modalities=(Modality("a", bands=(0, 1), std=(1.0,)),))


def test_warm_up_runs_every_modality(echo, scenes):
    Echo.seen.clear()
    Engine(echo(), warmup=True)
    assert Echo.seen
    assert set(Echo.seen[0]) == {"s2", "s1"}


def test_paths_of_modalities_are_checked_like_any_input(echo, tmp_path: Path, scenes):
    s2, _ = scenes
    (tmp_path / "notes.txt").write_text("not a raster")
    with pytest.raises(Exception, match="modality 's1': .*notes.txt.*not a readable raster"):
        Engine(echo()).generate_image({"s2": s2, "s1": str(tmp_path / "notes.txt")})


def test_a_missing_band_of_another_modality_gets_no_bands_hint(echo, scenes):
    s2, _ = scenes
    with pytest.raises(BandMismatchError) as info:
        Engine(echo()).generate_image({"s2": s2, "s1": s2})  # an S2 file as S1: no VV
    assert "modality 's1'" in str(info.value)
    assert "--bands" not in str(info.value)


def test_names_are_checked_before_anything_is_opened(echo, scenes):
    s2, _ = scenes
    with pytest.raises(InputError, match="unknown modality 'dem'"):  # not "no such file"
        Engine(echo()).generate_image({"s2": s2, "dem": "/nowhere/missing.tif"})
