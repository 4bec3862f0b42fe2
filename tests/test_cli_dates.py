"""Dates on the CLI (``--dates``, ``--time-series``, ``info --model``), through ``main(argv)``.

The two-date ``test-coords`` model is registered in this process only (tests.stub_models), so
these run the CLI in-process; its output bands 2-5 echo (year, day of year) of each date.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio

from geoserve.cli import main
from tests.conftest import write_geotiff


@pytest.fixture
def undated(tmp_path):
    return [
        str(write_geotiff(tmp_path / f"scene_{t}.tif", np.full((1, 16, 16), t + 1, np.int16)))
        for t in range(2)
    ]


def _predict(*args: str) -> int:
    return main(["predict", "-m", "test-coords", "-q", *args])


def test_dates_flag_gives_undated_files_their_dates(undated, tmp_path, capsys):
    out = tmp_path / "out.tif"
    assert _predict(*undated, "--time-series", "-o", str(out)) == 1
    err = capsys.readouterr().err
    assert "no acquisition date found" in err
    assert "--dates" in err
    assert (
        _predict(*undated, "--time-series", "--dates", "2021-05-01,2021-06-01", "-o", str(out)) == 0
    )
    with rasterio.open(out) as dst:
        seen = dst.read()[2:6, 0, 0].tolist()
    assert seen == [2021, 121, 2021, 152]


@pytest.mark.parametrize(
    ("dates", "message"),
    [
        ("2021-05-01,2021-13-01", "geoserve: error: --dates: '2021-13-01' is not a date"),
        ("2021-05-01", "geoserve: error: --dates: 1 date(s) given for 2 input(s)"),
        ("2021-05-01,", "geoserve: error: --dates: '' is not a date"),
    ],
)
def test_bad_dates_exit_1_one_line(undated, tmp_path, capsys, dates, message):
    code = _predict(*undated, "--time-series", "--dates", dates, "-o", str(tmp_path / "o.tif"))
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().startswith(message), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.tif").exists()


def test_one_date_per_request_tells_about_time_series_and_dates(undated, tmp_path, capsys):
    assert _predict(undated[0], "-o", str(tmp_path / "o.tif")) == 1
    err = capsys.readouterr().err.strip()
    assert "takes 2 dates per request, got 1 file(s) without --time-series" in err
    assert "--time-series" in err.split(":", 3)[-1]
    assert "--dates" in err
    assert len(err.splitlines()) == 1
    assert _predict(*undated, "-o", str(tmp_path / "outs")) == 1
    assert "got 2 file(s) without --time-series" in capsys.readouterr().err


def test_info_says_how_many_dates_a_model_needs(undated, capsys):
    assert main(["info", undated[0], "--model", "test-coords"]) == 1  # no date: says how
    out = capsys.readouterr().out
    assert "fits test-coords: no:" in out
    assert "--dates" in out
    dated = write_geotiff(
        Path(undated[0]).with_name("S2_20210501T101010.tif"),
        np.ones((1, 16, 16), np.int16),
    )
    assert main(["info", str(dated), "--model", "test-coords"]) == 0
    out = capsys.readouterr().out
    assert "date:      2021-05-01" in out
    assert "fits test-coords: needs 2 dates" in out
    assert "--time-series" in out
    assert "fits test-coords: yes" not in out
