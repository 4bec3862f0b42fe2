"""Dates over HTTP: a ``dates`` field (JSON or form) or dated part file names, on a real server.

An upload is dated as a file on disk is: an explicit date, else its tags, else the stamp in
its name (the part's file name). ``test-coords`` takes two dates and echoes (year, day of year)
of each in output bands 2-5.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from tests.conftest import serve_ranges, write_geotiff
from tests.server.conftest import running_server
from tests.server.test_app import decode


@pytest.fixture(scope="module")
def url():
    with running_server(model="test-coords", allowed_url_domains=["127.0.0.1"]) as base:
        yield base


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Two undated GeoTIFFs of one place, as bytes."""
    root = tmp_path_factory.mktemp("dates")
    return [
        write_geotiff(root / f"s{t}.tif", np.full((1, 16, 16), t + 1, np.int16)).read_bytes()
        for t in range(2)
    ]


def _seen(content: bytes) -> list[int]:
    data, _ = decode(content)
    return data[2:6, 0, 0].astype(int).tolist()


def _parts(scenes, names=("a.tif", "b.tif")):
    return [("file", (name, raw)) for name, raw in zip(names, scenes, strict=True)]


def test_upload_without_dates_fails_and_says_how(url, scenes):
    resp = httpx.post(f"{url}/v1/images", files=_parts(scenes))
    assert resp.status_code == 400
    message = resp.json()["message"]
    assert "no acquisition date found" in message
    assert "'dates' field" in message


@pytest.mark.parametrize(
    "form",
    [{"dates": "2021-05-01,2021-06-01"}, {"dates": ["2021-05-01", "2021-06-01"]}],
    ids=["comma-separated", "one-field-per-date"],
)
def test_upload_with_a_dates_field(url, scenes, form):
    resp = httpx.post(f"{url}/v1/images", files=_parts(scenes), data=form)
    assert resp.status_code == 200, resp.text
    assert _seen(resp.content) == [2021, 121, 2021, 152]


def test_upload_dated_by_part_file_names(url, scenes):
    names = ("HLS.S30.T10SEG.2021121T183919.v2.0.tif", "S2_20210601T101010.tif")
    resp = httpx.post(f"{url}/v1/images", files=_parts(scenes, names))
    assert resp.status_code == 200, resp.text
    assert _seen(resp.content) == [2021, 121, 2021, 152]
    # a part name is only read for its date, never as a path
    odd = ("../../etc/x_20210501T000000.tif", "C:\\Temp\\20210601T000000")
    resp = httpx.post(f"{url}/v1/images", files=_parts(scenes, odd))
    assert resp.status_code == 200, resp.text
    assert _seen(resp.content) == [2021, 121, 2021, 152]
    # the dates field wins over the names
    resp = httpx.post(
        f"{url}/v1/images", files=_parts(scenes, names), data={"dates": "2022-02-01,2022-03-01"}
    )
    assert _seen(resp.content) == [2022, 32, 2022, 60]


def test_json_with_dates(url, scenes):
    body = {
        "data": [base64.b64encode(s).decode() for s in scenes],
        "dates": ["2021-05-01", "2021-06-01T10:00:00Z"],
        "out_data_format": "geotiff",
    }
    resp = httpx.post(f"{url}/v1/images", json=body)
    assert resp.status_code == 200, resp.text
    assert _seen(resp.content) == [2021, 121, 2021, 152]
    resp = httpx.post(f"{url}/v1/images", json={**body, "dates": None})
    assert resp.status_code == 400
    assert "no acquisition date found" in resp.json()["message"]
    # any JSON that is not a date is a 400 naming the field, not a 422
    for dates, message in (
        ([20210501, 20210601], "dates: 20210501 is not a date"),
        ([["2021-05-01"], "2021-06-01"], "dates: ['2021-05-01'] is not a date"),
        (5, "dates: 1 date(s) given for 2 input(s)"),
    ):
        resp = httpx.post(f"{url}/v1/images", json={**body, "dates": dates})
        assert resp.status_code == 400, resp.text
        assert message in resp.json()["message"]


@pytest.mark.parametrize(
    ("dates", "message"),
    [
        (["2021-05-01", "2021-02-30"], "dates: '2021-02-30' is not a date"),
        (["2021-05-01", "yesterday"], "dates: 'yesterday' is not a date"),
        (["2021-05-01"], "dates: 1 date(s) given for 2 input(s)"),
    ],
)
def test_bad_dates_are_400_naming_the_field(url, scenes, dates, message):
    body = {"data": [base64.b64encode(s).decode() for s in scenes], "dates": dates}
    resp = httpx.post(f"{url}/v1/images", json=body)
    assert resp.status_code == 400
    assert message in resp.json()["message"]
    form = httpx.post(f"{url}/v1/images", files=_parts(scenes), data={"dates": ",".join(dates)})
    assert form.status_code == 400
    assert message in form.json()["message"]


def test_date_count_and_values_checked_before_any_download(url, tmp_path):
    write_geotiff(tmp_path / "x.tif", np.ones((1, 16, 16), np.int16))
    with serve_ranges(tmp_path) as (base, log):
        urls = [f"{base}/x.tif"] * 2
        for extra in (
            {"data": [*urls, urls[0]]},  # more dates than the model takes
            {"data": urls, "dates": ["2021-05-01"]},
            {"data": urls, "dates": ["2021-05-01", "2021-05-32"]},
        ):
            resp = httpx.post(f"{url}/v1/images", json={"data_format": "url", **extra})
            assert resp.status_code == 400, resp.text
        assert log == []
        ok = {"data": urls, "dates": ["2021-05-01", "2021-06-01"], "data_format": "url"}
        resp = httpx.post(f"{url}/v1/images", json={**ok, "out_data_format": "geotiff"})
        assert resp.status_code == 200, resp.text
        assert _seen(resp.content) == [2021, 121, 2021, 152]


def test_a_part_file_name_ranks_like_a_file_name_after_the_files_tags(url, tmp_path):
    """The same two files get the same dates over HTTP as on the CLI: tags, then names."""
    raws = [
        write_geotiff(
            tmp_path / f"t{t}.tif",
            np.full((1, 16, 16), 1, np.int16),
            tags={"ACQUISITION_DATE": f"2020-0{5 + 2 * t}-01"},
        ).read_bytes()
        for t in range(2)
    ]
    names = ("t_20200601T000000.tif", "u_20200801T000000.tif")
    resp = httpx.post(f"{url}/v1/images", files=_parts(raws, names))
    assert resp.status_code == 200, resp.text
    assert _seen(resp.content) == [2020, 122, 2020, 183]  # 1 May and 1 July: the tags


def test_a_broken_part_is_named_by_its_file_name(url, scenes):
    parts = _parts([scenes[0], scenes[1][:9]], ("first.tif", "../secret/second.tif"))
    resp = httpx.post(f"{url}/v1/images", files=parts, data={"dates": "2021-05-01,2021-06-01"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith("upload 'second.tif': not a readable raster")


def test_too_many_parts_are_refused_in_the_words_of_an_upload(url, scenes):
    resp = httpx.post(f"{url}/v1/images", files=_parts([*scenes, scenes[0]], ("a", "b", "c")))
    assert resp.status_code == 400
    assert resp.json()["message"] == "file: 3 parts given; model 'test-coords' takes 2 dates"
