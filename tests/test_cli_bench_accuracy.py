"""``geoserve bench-accuracy``: a faster setting against float32 on the user's own scene."""

from __future__ import annotations

import json

from geoserve import Engine
from geoserve.accuracy import AccuracyReport, RunReport
from tests.conftest import LAKE
from tests.test_cli import run


def test_int8_against_float32_with_labels(tmp_path):
    labels = tmp_path / "labels.tif"  # float32's own classes: its IoU must be exactly 1
    Engine("demo-water", output_kind=["classes"]).generate_image(LAKE, output_path=labels)
    res = run("bench-accuracy", "--quantize", "int8", str(LAKE), "--labels", str(labels), "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["model"] == "demo-water"
    assert report["pixels"] == 1536 * 768
    assert report["reference"]["settings"] == "float32"
    assert report["candidate"]["settings"] == "quantize=int8"
    assert report["reference"]["iou"] == {"not water": 1.0, "water": 1.0}
    assert 0.995 <= report["class_agreement"] < 1.0
    assert min(report["candidate"]["iou"].values()) >= 0.98
    assert 0 < report["max_rel_error"] < 0.05
    assert report["speedup"] > 0

    report.pop("speedup")  # the same report for people (what the command prints without --json)
    runs = {k: RunReport(**report.pop(k)) for k in ("reference", "candidate")}
    text = "\n".join(AccuracyReport(**report, **runs).lines())
    assert f"class agreement: {100 * report['class_agreement']:.3f} %" in text
    assert "candidate  (quantize=int8)" in text
    assert "IoU against the labels, reference: not water 1.0000, water 1.0000" in text


def test_nothing_to_compare_and_labels_off_the_grid_are_refused_before_running(tmp_path):
    res = run("bench-accuracy", str(LAKE))
    assert res.returncode == 1
    assert "nothing to compare" in res.stderr
    assert "--quantize int8" in res.stderr
    other = LAKE.parent.parent / "tests" / "data" / "RGB.byte.tif"
    res = run("bench-accuracy", "--quantize", "int8", str(LAKE), "--labels", str(other))
    assert res.returncode == 1
    assert f"{other}: labels are 791 x 718 pixels, the scene 1536 x 768" in res.stderr
    assert "running" in res.stdout
    assert "Traceback" not in res.stderr
    # labels are an input like any other: a VRT (which may read any file it names) is refused
    vrt = tmp_path / "labels.vrt"
    vrt.write_text(
        '<VRTDataset rasterXSize="1536" rasterYSize="768"><VRTRasterBand dataType="Byte" '
        f'band="1"><SimpleSource><SourceFilename>{LAKE}</SourceFilename>'
        "<SourceBand>1</SourceBand></SimpleSource></VRTRasterBand></VRTDataset>"
    )
    res = run("bench-accuracy", "--quantize", "int8", str(LAKE), "--labels", str(vrt))
    assert res.returncode == 1
    assert str(vrt) in res.stderr
    assert "VRT" in res.stderr
