"""Acquisition dates given explicitly in Python (``dates=``), on a real two-date model.

``test-coords`` echoes what it receives: output bands 2-5 are (year, day of year) of its two
dates, so the date the model saw is read back from the output.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from rasterio.crs import CRS

from geoserve import Engine, RasterArray
from geoserve.errors import InputError
from tests.conftest import UTM_TRANSFORM, write_geotiff


@pytest.fixture(scope="module")
def engine():
    with Engine("test-coords") as eng:
        yield eng


def _undated(tmp_path, n=2, **kwargs):
    """``n`` GeoTIFFs of one place with no date tag and no date in their names."""
    return [
        write_geotiff(tmp_path / f"scene_{t}.tif", np.full((1, 16, 16), t + 1, np.int16), **kwargs)
        for t in range(n)
    ]


def _seen(out):
    """(year, day of year) of each date the model saw, from the echoed output."""
    t = out.outputs.tensor.numpy()
    return [(int(t[2, 0, 0]), int(t[3, 0, 0])), (int(t[4, 0, 0]), int(t[5, 0, 0]))]


def test_undated_inputs_need_dates_and_the_error_says_how(engine, tmp_path):
    files = _undated(tmp_path)
    with pytest.raises(InputError, match="no acquisition date found") as err:
        engine.generate_image(tuple(files), out_format="tensor")
    message = str(err.value)
    assert "dates=" in message
    assert "--dates" in message
    assert "'dates' field" in message


def test_dates_as_strings_dates_and_datetimes(engine, tmp_path):
    files = _undated(tmp_path)
    out = engine.generate_image(
        tuple(files), out_format="tensor", dates=["2021-05-01", "2021-06-01"]
    )
    assert _seen(out) == [(2021, 121), (2021, 152)]
    utc = dt.timezone.utc
    when = [dt.date(2020, 1, 31), dt.datetime(2020, 12, 31, 23, 30, tzinfo=utc)]
    assert _seen(engine.generate_image(tuple(files), out_format="tensor", dates=when)) == [
        (2020, 31),
        (2020, 366),
    ]
    # ISO datetimes, with a zone: the date part as written
    iso = ["2021-05-01T10:21:01Z", "2021-06-01T23:30:00-05:00"]
    assert _seen(engine.generate_image(tuple(files), out_format="tensor", dates=iso)) == [
        (2021, 121),
        (2021, 152),
    ]


def test_explicit_dates_win_over_tags_and_file_names(engine, tmp_path):
    tagged = write_geotiff(
        tmp_path / "S2_20190301T101010.tif",
        np.ones((1, 16, 16), np.int16),
        tags={"ACQUISITION_DATE": "2019-04-01"},
    )
    named = write_geotiff(tmp_path / "S2_20190501T101010.tif", np.ones((1, 16, 16), np.int16))
    # without dates: the tag wins over the name for the first, the name gives the second
    assert _seen(engine.generate_image((tagged, named), out_format="tensor")) == [
        (2019, 91),
        (2019, 121),
    ]
    out = engine.generate_image(
        (tagged, named), out_format="tensor", dates=["2022-02-01", "2022-03-01"]
    )
    assert _seen(out) == [(2022, 32), (2022, 60)]
    # None for one input: that one keeps its own date
    out = engine.generate_image((tagged, named), out_format="tensor", dates=[None, "2022-03-01"])
    assert _seen(out) == [(2019, 91), (2022, 60)]


def test_several_requests_take_flat_or_nested_dates(engine, tmp_path):
    a, b = _undated(tmp_path)
    items = [[a, b], [b, a]]
    flat = ["2021-01-01", "2021-01-02", "2021-01-03", "2021-01-04"]
    nested = [flat[:2], flat[2:]]
    for dates in (flat, nested):
        first, second = engine.generate_image(items, out_format="tensor", dates=dates)
        assert _seen(first) == [(2021, 1), (2021, 2)]
        assert _seen(second) == [(2021, 3), (2021, 4)]


def test_add_request_takes_dates(engine, tmp_path):
    files = _undated(tmp_path)
    rid = engine.add_request(files, out_format="tensor", dates=["2021-05-01", "2021-06-01"])
    (out,) = [r for r in engine.run_until_done() if r.request_id == rid]
    assert _seen(out.raise_for_error()) == [(2021, 121), (2021, 152)]


def test_raster_array_dates_from_its_profile_tags(engine):
    def scene(day: str) -> RasterArray:
        profile = {
            "crs": CRS.from_epsg(32633),
            "transform": UTM_TRANSFORM,
            "tags": {"ACQUISITION_DATE": day},
        }
        return RasterArray(np.ones((1, 16, 16), np.int16), profile)

    out = engine.generate_image((scene("2021-05-01"), scene("2021-06-01")), out_format="tensor")
    assert _seen(out) == [(2021, 121), (2021, 152)]


@pytest.mark.parametrize(
    ("dates", "message"),
    [
        (["2021-05-01"], "dates: 1 date(s) given for 2 input(s)"),
        (["2021-05-01", "2021-02-30"], "dates: '2021-02-30' is not a date (use ISO 8601"),
        (["2021-05-01", "May 1st"], "dates: 'May 1st' is not a date"),
        (["2021-05-01", 20210501], "dates: 20210501 is not a date"),
    ],
)
def test_bad_dates_name_the_field_and_value(engine, tmp_path, dates, message):
    files = _undated(tmp_path)
    with pytest.raises(InputError) as err:
        engine.generate_image(tuple(files), out_format="tensor", dates=dates)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_dates_for_a_list_must_match_its_inputs(engine, tmp_path):
    a, b = _undated(tmp_path)
    with pytest.raises(InputError, match=r"dates: 3 date\(s\) given for 4 input\(s\)"):
        engine.generate_image([[a, b], [b, a]], out_format="tensor", dates=["2021-01-01"] * 3)
    with pytest.raises(InputError, match="dates: 1 entries given for 2 request"):
        engine.generate_image([[a, b], [b, a]], out_format="tensor", dates=[["2021-01-01"] * 2])
