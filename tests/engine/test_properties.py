"""Correctness properties of the whole pipeline (GeoTIFF in -> patches -> model -> GeoTIFF out)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geoserve import MODEL_REGISTRY, Engine, RasterArray
from tests.conftest import processors_of, read, write_geotiff
from tests.stub_models import BOX_RADIUS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    h=st.integers(1, 90),
    w=st.integers(1, 90),
    patch=st.integers(1, 40),
    data=st.data(),
)
def test_identity_center_reproduces_input_exactly(h, w, patch, data):
    stride = data.draw(st.integers(1, patch))
    batch = data.draw(st.integers(1, 70))
    rng = np.random.default_rng(h * 1000 + w)
    image = rng.integers(0, 65535, size=(2, h, w), dtype=np.uint16)
    engine = Engine(
        "identity",
        patch_size=patch,
        stride=stride,
        blend="center",
        max_batch_patches=batch,
        warmup=False,
    )
    out = engine.generate_image(
        RasterArray(image, {"crs": "EPSG:32633", "transform": (10, 0, 0, 0, -10, 0)}),
        out_format="tensor",
    )
    np.testing.assert_array_equal(out.outputs.tensor.numpy(), image.astype(np.float32))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    h=st.integers(1, 70),
    w=st.integers(1, 70),
    patch=st.integers(4, 40),
    dtype=st.sampled_from(["uint8", "int16", "uint16", "float32"]),
    share=st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]),
    data=st.data(),
)
def test_identity_keeps_each_bands_own_nodata(h, w, patch, dtype, share, data):
    """identity's output equals its input band by band: a value that is nodata in one band is
    NaN in that band only, and the pixel's other bands keep their values."""
    import tempfile
    from pathlib import Path

    import rasterio

    stride = data.draw(st.integers(1, patch))
    preprocess = data.draw(st.sampled_from(["host", "device"]))
    rng = np.random.default_rng(h * 1000 + w)
    image = rng.integers(1, 120, size=(3, h, w)).astype(dtype)
    nodata = 0 if dtype in ("uint8", "uint16") else -9999
    gone = rng.random(image.shape) < share  # per band, independently
    gone[-1, -1, -1] = False  # an image with no valid value at all gives one band of NaN
    image[gone] = nodata
    if dtype == "float32":
        image[0, 0, 0] = np.nan  # NaN is nodata in a float band whatever is declared
        gone[0, 0, 0] = True
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.tif", Path(tmp) / "out.tif"
        write_geotiff(src, image, nodata=nodata)
        engine = Engine(
            "identity",
            patch_size=patch,
            stride=stride,
            blend="center",
            preprocess=preprocess,
            warmup=False,
        )
        engine.generate_image(src, output_path=dst).raise_for_error()
        out, profile = read(dst)
        with rasterio.open(src) as a, rasterio.open(dst) as b:
            assert (a.crs, a.transform, a.width, a.height) == (
                b.crs,
                b.transform,
                b.width,
                b.height,
            )
            # GDAL's per-band masks of the output: nodata exactly where that band was
            np.testing.assert_array_equal(b.read_masks(), np.where(gone, 0, 255))
    assert np.isnan(profile["nodata"])
    np.testing.assert_array_equal(np.isnan(out), gone)
    np.testing.assert_array_equal(out[~gone], image[~gone].astype(np.float32))


@pytest.mark.parametrize("blend", ["none", "mean", "cosine"])
@pytest.mark.parametrize(("h", "w"), [(1, 1), (1, 77), (64, 1), (33, 31), (100, 70)])
def test_identity_other_blends_reproduce_input(blend, h, w):
    image = np.arange(3 * h * w, dtype=np.float32).reshape(3, h, w)
    stride = 32 if blend == "none" else 20
    engine = Engine("identity", patch_size=32, stride=stride, blend=blend, warmup=False)
    out = engine.generate_image(
        RasterArray(image, {"crs": "EPSG:4326", "transform": (1, 0, 0, 0, -1, 0)}),
        out_format="tensor",
    )
    np.testing.assert_allclose(out.outputs.tensor.numpy(), image, rtol=1e-6)


def test_identity_file_roundtrip_is_lossless(make_geotiff, tmp_path):
    src = make_geotiff(bands=4, height=301, width=229, descriptions=["B2", "B3", "B4", "B8"])
    dst = tmp_path / "out.tif"
    Engine("identity").generate_image(src, output_path=dst)
    a, pa = read(src)
    b, pb = read(dst)
    np.testing.assert_array_equal(b, a.astype(np.float32))
    for key in ("crs", "transform", "width", "height"):
        assert pa[key] == pb[key]
    with __import__("rasterio").open(dst) as ds:
        assert ds.descriptions == ("B2", "B3", "B4", "B8")


def test_tiled_equals_full_image_in_interior(make_geotiff):
    """A translation-equivariant conv with radius <= margin: tiles change nothing inside."""
    rng = np.random.default_rng(1)
    image = rng.integers(0, 50, size=(1, 97, 131)).astype(np.float32)
    engine = Engine("test-box")  # patch 32, stride 24 -> margin 4 >= radius 3
    patcher, _ = processors_of("test-box")
    assert patcher.patch_size - patcher.stride >= 2 * BOX_RADIUS
    tiled = engine.generate_image(
        RasterArray(image, {"crs": "EPSG:32633", "transform": (10, 0, 0, 0, -10, 0)}),
        out_format="tensor",
    ).outputs.tensor.numpy()
    box = MODEL_REGISTRY.get("test-box").factory()  # the same filter, on the whole image
    with torch.inference_mode():
        full = box(torch.from_numpy(image)[None]).numpy()[0]
    r = BOX_RADIUS
    np.testing.assert_array_equal(tiled[:, r:-r, r:-r], full[:, r:-r, r:-r])
    assert np.abs(tiled - full).max() > 0  # the borders do differ: the test can fail


@pytest.mark.parametrize("kind", ["classes", "probabilities", "raw"])
def test_output_independent_of_batch_size(make_geotiff, kind):
    rng = np.random.default_rng(2)
    paths = [
        make_geotiff(data=rng.integers(0, 400, size=(3, h, w)).astype(np.uint16))
        for h, w in ((45, 61), (17, 9), (80, 33))
    ]
    results = []
    for batch in (1, 3, 64):
        engine = Engine("test-seg", max_batch_patches=batch, output_kind=kind)
        outs = engine.generate_image(paths, out_format="tensor")
        results.append([o.outputs.tensor.numpy() for o in outs])
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=False):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
            if kind == "classes":
                np.testing.assert_array_equal(a, b)


def test_interleaved_requests_equal_requests_run_alone(make_geotiff, spy_model):
    rng = np.random.default_rng(3)
    sizes = [(40, 40), (13, 70), (90, 21), (5, 5), (64, 48)]
    paths = [
        make_geotiff(data=rng.integers(0, 400, size=(3, h, w)).astype(np.uint16)) for h, w in sizes
    ]
    model, seen = spy_model("test-seg")
    engine = Engine(model, max_batch_patches=7, output_kind="raw")
    seen.clear()  # the warm-up pass
    ids = [engine.add_request(p, out_format="tensor") for p in paths]
    together = {r.request_id: r.outputs.tensor.numpy() for r in engine.run_until_done()}
    batches = list(seen)
    owner: dict[bytes, str] = {}  # each request's patches, as the model saw them run alone
    for rid, path in zip(ids, paths, strict=True):
        alone_engine = Engine(model, output_kind="raw")
        seen.clear()
        alone = alone_engine.generate_image(path, out_format="tensor")
        owner.update({patch.numpy().tobytes(): rid for batch in seen for patch in batch})
        # the conv's float sums may round differently at another batch shape: ulp-level only
        np.testing.assert_allclose(
            together[rid], alone.outputs.tensor.numpy(), rtol=1e-5, atol=1e-4
        )
    shared = [{owner[patch.numpy().tobytes()] for patch in batch} for batch in batches]
    assert any(len(b) > 1 for b in shared), "patches of several requests never shared a batch"


def test_segmentation_outputs_agree(make_geotiff):
    rng = np.random.default_rng(4)
    path = make_geotiff(data=rng.integers(0, 400, size=(3, 50, 50)).astype(np.uint16))
    classes = Engine("test-seg").generate_image(path, out_format="tensor").outputs.tensor
    probs = (
        Engine("test-seg", output_kind="probabilities")
        .generate_image(path, out_format="tensor")
        .outputs.tensor
    )
    assert classes.dtype == torch.uint8
    assert probs.dtype == torch.float32
    assert probs.shape == (4, 50, 50)
    np.testing.assert_allclose(probs.sum(0).numpy(), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(probs.argmax(0).numpy(), classes[0].numpy())


def test_transform_batches_raw_tensors():
    engine = Engine("identity", patch_size=16, stride=12, max_batch_patches=5)
    tensors = [
        torch.arange(2 * 20 * 30, dtype=torch.float32).reshape(2, 20, 30),
        torch.rand(1, 3, 7, 9),
    ]
    outs = engine.transform(tensors)
    assert [o.ok for o in outs] == [True, True]
    torch.testing.assert_close(outs[0].tensors, tensors[0])
    # (C, T, H, W) -> patches are (C, T, P, P); identity returns them as (T*C) bands
    torch.testing.assert_close(outs[1].tensors, tensors[1].permute(1, 0, 2, 3).reshape(3, 7, 9))
    bad = engine.transform([torch.zeros(5)])
    assert bad[0].error is not None
    assert "expected (C, H, W)" in str(bad[0].error)


def test_multi_date_layout_and_coords(tmp_path):
    """Each date's band reaches the model in (C, T) order with its own date and the location."""
    paths = []
    for t, date in enumerate(("2020-03-01", "2020-12-31")):
        data = np.full((2, 20, 24), 10 * (t + 1), dtype=np.int16)
        paths.append(write_geotiff(tmp_path / f"d{t}.tif", data, tags={"ACQUISITION_DATE": date}))
    out = Engine("test-coords").generate_image([paths], out_format="tensor")[0]
    y = out.raise_for_error().outputs.tensor.numpy()
    assert y.shape == (2 + 4 + 2, 20, 24)
    assert (y[0] == 10).all()
    assert (y[1] == 20).all()
    assert (y[2] == 2020).all()
    assert (y[3] == 61).all()
    assert (y[4] == 2020).all()
    assert (y[5] == 366).all()
    assert np.allclose(y[6], 13.5, atol=1.5)
    assert np.allclose(y[7], 52, atol=1.5)


def test_engine_close_releases_pending_requests(make_geotiff):
    path = make_geotiff(bands=3, height=100, width=100)
    with Engine("identity", patch_size=16, stride=16, blend="none") as engine:
        engine.add_request(path, out_format="tensor")
        engine.step()  # one batch done, rows still pending, a prefetch in flight
        assert engine.has_unfinished()
    assert not engine.has_unfinished()


def _scheduled_order(engine: Engine, seen: list[torch.Tensor], names: dict[int, str]) -> list[str]:
    """Whose patch each forward pass ran, in order: each request's pixels hold its own value."""
    list(engine.run_until_done())
    return [names[int(batch.flatten()[0])] for batch in seen]


# Priority decides the order patches enter the model; results are then committed on writer
# threads, so the order they are *returned* in is the order their commits finished.
def test_priority_lower_first_then_arrival(make_geotiff, spy_model, monkeypatch):
    monkeypatch.setenv("GEOSERVE_TEST_SLOW", "0")  # (an identity that would sleep)
    paths = [make_geotiff(data=np.full((3, 16, 16), v, np.uint16)) for v in (1, 2, 3)]
    model, seen = spy_model("test-slow")
    engine = Engine(model, max_batch_patches=1)
    seen.clear()  # the warm-up pass
    engine.add_request(paths[0], out_format="tensor", priority=5)
    engine.add_request(paths[1], out_format="tensor", priority=0)
    engine.add_request(paths[2], out_format="tensor", priority=5)
    assert engine.queued_patches == 3
    order = _scheduled_order(engine, seen, {1: "late", 2: "first", 3: "later"})
    assert order == ["first", "late", "later"]
    assert engine.queued_patches == 0


def test_priority_holds_while_the_first_in_line_is_still_being_read(make_geotiff, spy_model):
    """A request first in line keeps its turn while its row is read, rather than being
    overtaken by requests whose rows happened to be read sooner."""
    paths = [make_geotiff(data=np.full((3, 16, 16), v, np.uint16)) for v in (1, 2, 3)]
    model, seen = spy_model("test-slow-read")
    engine = Engine(model, max_batch_patches=1)
    seen.clear()
    engine.add_request(paths[0], out_format="tensor", priority=5)
    engine.add_request(paths[1], out_format="tensor", priority=0)
    engine.add_request(paths[2], out_format="tensor", priority=5)
    order = _scheduled_order(engine, seen, {1: "late", 2: "first", 3: "later"})
    assert order == ["first", "late", "later"]


def test_cross_request_batching_off_keeps_batches_to_one_request(make_geotiff, spy_model):
    # each request's pixels hold its own value, so a patch's values say whose it is
    paths = [make_geotiff(data=np.full((3, 20, 20), i + 1, np.uint16)) for i in range(3)]
    model, seen = spy_model("identity")
    engine = Engine(
        model,
        patch_size=8,
        stride=8,
        blend="none",
        cross_request_batching=False,
        max_batch_patches=64,
    )
    seen.clear()  # the warm-up pass
    outs = engine.generate_image(paths, out_format="tensor")
    assert all(o.ok for o in outs)
    requests = [set(torch.unique(batch).tolist()) for batch in seen]
    assert all(len(r) == 1 for r in requests)
    assert len(seen) >= 3


def test_abort_request_drops_its_patches(make_geotiff):
    path = make_geotiff(bands=3, height=64, width=64)
    engine = Engine("identity", patch_size=8, stride=8, blend="none", max_batch_patches=4)
    rid = engine.add_request(path, out_format="tensor")
    engine.step()
    assert engine.queued_patches == 64 - 4
    assert engine.abort_request(rid)
    assert not engine.abort_request(rid)
    assert engine.queued_patches == 0
    assert not engine.has_unfinished()
