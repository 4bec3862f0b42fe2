"""``geoserve.Client`` and ``geoserve predict --server`` against a real server on 127.0.0.1.

One server per module (test-seg, an API key, jobs under a temporary output directory); the
local runs it is compared with run in this process. A fake server on 127.0.0.1 answers what a
malicious one could: the client must refuse it and write nothing outside its destination.
"""

from __future__ import annotations

import http.server
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import geoserve
from geoserve.cli import main
from geoserve.errors import (
    GeoServeError,
    JobDismissedError,
    JobFailedError,
    ServerAuthError,
    ServerUnreachableError,
    UntrustedAnswerError,
)
from tests.conftest import http_server, write_geotiff
from tests.server.conftest import free_port, running_server

KEY = "client-test-key"
JOB = "job-" + "ab" * 16


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("client_inputs")
    rng = np.random.default_rng(11)
    for name, (h, w) in {"lake": (40, 52), "coast": (30, 44)}.items():
        write_geotiff(root / f"{name}.tif", rng.integers(0, 400, (3, h, w)).astype(np.uint16))
    write_geotiff(root / "one_band.tif", np.ones((1, 20, 20), np.uint16))
    (root / "broken.tif").write_bytes(b"this is not a TIFF")
    return root


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("client_server_outputs")
    with running_server(model="test-seg", output_dir=out, api_key=KEY) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[geoserve.Client]:
    with geoserve.Client(url, KEY) as c:
        yield c


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_job_equals_a_local_run_bit_for_bit(
    client: geoserve.Client, scenes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = client.submit(scenes / "lake.tif", model="test-seg")
    assert re.fullmatch(r"job-[0-9a-f]{32}", job_id)
    final = client.wait(job_id, progress=True, poll=0.1)
    assert (final.status, final.progress) == ("successful", 100)
    assert final.patches is not None
    assert final.patches[0] == final.patches[1] > 1
    assert final.seconds is not None
    lines = capsys.readouterr().err.splitlines()
    n = final.patches[1]
    assert lines[-1].startswith(f"progress: {n}/{n} patches (100%)"), lines
    paths = client.results(job_id, tmp_path / "job")
    assert set(paths) == {"classes", "stac-item"}
    local = tmp_path / "local" / "out.tif"
    local.parent.mkdir()
    result = geoserve.Engine("test-seg").generate_image(str(scenes / "lake.tif"), output_path=local)
    assert result.error is None
    assert paths["classes"].read_bytes() == local.read_bytes()
    sidecar = Path(f"{local}.aux.xml")
    assert sidecar.is_file()  # a class map's class names: downloaded beside it, the same
    assert Path(f"{paths['classes']}.aux.xml").read_bytes() == sidecar.read_bytes()
    item = json.loads(paths["stac-item"].read_text())
    assert item["assets"]["classes"]["href"] == paths["classes"].name
    assert not [p.name for p in (tmp_path / "job").iterdir() if p.name.startswith(".")]


def test_a_failed_job_raises_the_servers_message(client: geoserve.Client, scenes: Path) -> None:
    job_id = client.submit(scenes / "broken.tif")
    with pytest.raises(JobFailedError, match=r"failed: .*broken\.tif") as caught:
        client.wait(job_id, poll=0.1)
    assert caught.value.error is not None
    assert caught.value.error["status"] == 400
    job_id = client.submit(scenes / "one_band.tif")
    with pytest.raises(JobFailedError, match="one_band.tif"):
        client.wait(job_id, poll=0.1)
    with pytest.raises(JobFailedError, match="failed"):
        client.results(job_id, "never-written")
    assert not Path("never-written").exists()


def test_refusals_before_any_job(client: geoserve.Client, scenes: Path, tmp_path: Path) -> None:
    with pytest.raises(GeoServeError, match="serves model 'test-seg', not 'demo-water'"):
        client.submit(scenes / "lake.tif", model="demo-water")
    with pytest.raises(GeoServeError, match="gone.tif: no such file"):
        client.submit(tmp_path / "gone.tif")
    with pytest.raises(GeoServeError, match="mixes them"):
        client.submit([str(scenes / "lake.tif"), "https://example.com/b.tif"])
    with pytest.raises(GeoServeError, match=r"400.*bands"):  # the server's own check
        client.submit(scenes / "lake.tif", bands=[0, 1, 2, 3, 4, 5, 6])


def test_dismiss(client: geoserve.Client, scenes: Path) -> None:
    job_id = client.submit(scenes / "coast.tif")
    assert client.dismiss(job_id).status == "dismissed"
    with pytest.raises(JobDismissedError, match=f"job {job_id} was dismissed"):
        client.wait(job_id)
    with pytest.raises(JobDismissedError):
        client.results(job_id, "never-written")


def test_a_wrong_or_missing_key_is_a_clear_error(url: str, scenes: Path) -> None:
    for key in ("wrong-key", None):
        with (
            geoserve.Client(url, key) as c,
            pytest.raises(ServerAuthError, match=rf"POST {re.escape(url)}/v1/jobs: 401"),
        ):
            c.submit(scenes / "lake.tif")


def test_an_unreachable_server_is_named(scenes: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        geoserve.Client(dead) as c,
        pytest.raises(ServerUnreachableError, match=rf"{re.escape(dead)}/v1/jobs: cannot reach"),
    ):
        c.submit(scenes / "lake.tif")
    assert main(["predict", str(scenes / "lake.tif"), "-o", "x.tif", "--server", dead]) == 1


def test_predict_server_writes_the_local_files(
    url: str, scenes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake, coast = str(scenes / "lake.tif"), str(scenes / "coast.tif")
    remote, local = tmp_path / "remote", tmp_path / "local"
    remote.mkdir()
    local.mkdir()
    server = ["--server", url, "--api-key", KEY]
    assert main(["predict", lake, "-o", str(remote / "water.tif"), "--stac-item", *server]) == 0
    out = capsys.readouterr()
    assert f"wrote {remote / 'water.tif'} (52x40, 1 band(s) uint8" in out.out
    assert f"wrote {remote / 'water.json'} (STAC Item)" in out.out
    progress = [ln for ln in out.err.splitlines() if ln.startswith("progress: ")]
    assert "(100%)" in progress[-1]
    assert (
        main(["predict", lake, "-o", str(local / "water.tif"), "--stac-item", "-m", "test-seg"])
        == 0
    )
    local_err = capsys.readouterr().err
    assert progress[-1].split(",")[0] in local_err  # "progress: N/N patches (100%)"
    got, want = files_under(remote), files_under(local)
    assert set(got) == set(want) == {"water.tif", "water.tif.aux.xml", "water.json"}
    assert got["water.tif"] == want["water.tif"]
    assert got["water.tif.aux.xml"] == want["water.tif.aux.xml"]
    item = json.loads(got["water.json"])
    assert item["id"] == "water"
    assert item["assets"]["classes"]["href"] == "water.tif"
    assert item["properties"]["geoserve:inputs"] == [lake]
    # several inputs and kinds into a directory: the same names as a local run
    kinds = ["--output-kind", "classes,confidence"]
    assert main(["predict", lake, coast, "-o", str(remote / "d"), *kinds, *server]) == 0
    assert "2 of 2 inputs done, 0 failed" in capsys.readouterr().out
    assert main(["predict", lake, coast, "-o", str(local / "d"), *kinds, "-m", "test-seg"]) == 0
    got, want = files_under(remote / "d"), files_under(local / "d")
    assert set(got) == set(want)
    assert {"lake_classes.tif", "lake_confidence.tif", "coast_classes.tif"} <= set(got)
    assert got == want


def test_predict_server_refuses_local_flags_and_reports_failures(
    url: str, scenes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = str(scenes / "lake.tif")
    server = ["--server", url, "--api-key", KEY]
    for flags, named in (
        (["--device", "cpu", "--batch-size", "4"], "--device, --max-batch-patches"),
        (["--quicklook", str(tmp_path / "q.png")], "--quicklook"),
        (["-m", "demo-water"], "serves 'test-seg'"),
    ):
        assert main(["predict", lake, "-o", str(tmp_path / "o.tif"), *flags, *server]) == 1
        err = capsys.readouterr().err
        assert named in err
        assert "Traceback" not in err
    config = tmp_path / "config.yaml"
    config.write_text("dtype: bf16\n")
    assert main(["predict", lake, "-o", "o.tif", "--config", str(config), *server]) == 1
    assert "dtype: engine options, not with --server" in capsys.readouterr().err
    assert main(["predict", lake, "-o", str(tmp_path / "o.tif"), "--server", url]) == 1
    assert "401" in capsys.readouterr().err
    missing = tmp_path / "no" / "o.tif"  # as a local run says it, before any job
    assert main(["predict", lake, "-o", str(missing), *server]) == 1
    assert f"output directory {missing.parent} does not exist" in capsys.readouterr().err
    # unreadable here: said before any job, as a local run says it; refused by the model on
    # the server: the job's failure, in the server's words; the rest still runs
    broken, gone = str(scenes / "broken.tif"), str(tmp_path / "gone.tif")
    one_band = str(scenes / "one_band.tif")
    inputs = [broken, lake, gone, one_band]
    assert main(["predict", *inputs, "-o", str(tmp_path / "d"), *server]) == 1
    out = capsys.readouterr()
    assert f"geoserve: error: {gone}: no such file" in out.err
    assert f"geoserve: error: {broken}: not a readable raster" in out.err
    assert re.search(r"geoserve: error: job job-[0-9a-f]{32} failed: .*one_band\.tif", out.err)
    assert "1 of 4 inputs done, 3 failed" in out.out
    assert sorted(files_under(tmp_path / "d")) == ["lake_pred.tif", "lake_pred.tif.aux.xml"]


def test_docs_python_example_runs(
    url: str, scenes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/serving.md's geoserve.Client example and its ``predict --server`` command, as
    written but for the server (and its key) and the scene."""
    doc = (Path(__file__).resolve().parents[2] / "docs/serving.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "geoserve.Client" in b]
    code = code.replace("http://localhost:8000", url).replace("api_key=None", f"api_key={KEY!r}")
    monkeypatch.chdir(tmp_path)
    write_geotiff(tmp_path / "scene.tif", np.full((3, 24, 24), 150, np.uint16))
    exec(compile(code, "serving.md", "exec"), {})  # noqa: S102
    assert (tmp_path / "results" / "out.tif").is_file()
    (command,) = [
        line
        for b in re.findall(r"```text\n(.*?)```", doc, re.S)
        for line in b.splitlines()
        if line.startswith("geoserve predict") and "--server" in line
    ]
    argv = shlex.split(command.replace("http://localhost:8000", url))[1:]
    assert main([*argv, "--api-key", KEY]) == 0
    assert {"water.tif", "water.tif.aux.xml", "water.json"} <= {p.name for p in tmp_path.iterdir()}


# -- a malicious server ----------------------------------------------------------------------


class _Malicious(http.server.BaseHTTPRequestHandler):
    """Answers as :data:`ANSWERS` says (path -> JSON or bytes); records what was asked."""

    answers: dict[str, Any] = {}
    asked: list[str] = []

    def _answer(self) -> None:
        self.asked.append(f"{self.command} {self.path}")
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        answer = self.answers.get(self.path, {"detail": "no such thing"})
        redirect = isinstance(answer, tuple)  # ("redirect", to)
        raw = (
            b""
            if redirect
            else answer
            if isinstance(answer, bytes)
            else json.dumps(answer).encode()
        )
        self.send_response(302 if redirect else 200 if self.path in self.answers else 404)
        if redirect:
            self.send_header("Location", answer[1])
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def malicious(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    _Malicious.answers, _Malicious.asked = {}, []
    with http_server(_Malicious) as base:
        status = {"jobID": JOB, "status": "successful", "progress": 100, "message": ""}
        _Malicious.answers[f"/v1/jobs/{JOB}"] = status
        dest = tmp_path / "dest"
        yield base, dest


@pytest.mark.parametrize(
    ("href", "why"),
    [
        ("http://elsewhere.example/v1/jobs/{job}/outputs/out.tif", "not a download of this job"),
        ("{base}/v1/jobs/{job}/outputs/../../evil.tif", "not a plain file name"),
        ("{base}/v1/jobs/{job}/outputs/sub/evil.tif", "not a plain file name"),
        ("{base}/v1/jobs/{job}/outputs/%2e%2e%2fevil.tif", "not a plain file name"),
        ("{base}/v1/jobs/{job}/outputs/.hidden", "not a plain file name"),
        ("{base}/v1/jobs/job-{other}/outputs/out.tif", "not a download of this job"),
    ],
)
def test_a_malicious_results_document_is_refused(
    malicious: tuple[str, Path], href: str, why: str
) -> None:
    base, dest = malicious
    link = href.format(base=base, job=JOB, other="cd" * 16)
    _Malicious.answers[f"/v1/jobs/{JOB}/results"] = {"classes": {"href": link, "size": 4}}
    with geoserve.Client(base) as c, pytest.raises(UntrustedAnswerError, match=why):
        c.results(JOB, dest)
    assert not any(a.startswith("GET /v1/jobs/job-cd") or "evil" in a for a in _Malicious.asked)
    assert not dest.exists() or not list(dest.iterdir())
    assert sorted(p.name for p in dest.parent.iterdir()) == (["dest"] if dest.exists() else [])


def test_malicious_job_ids_sizes_and_redirects_are_refused(malicious: tuple[str, Path]) -> None:
    base, dest = malicious
    with geoserve.Client(base) as c:
        for bad in ("../../etc/passwd", "job-../x", 7):
            _Malicious.answers["/v1/jobs"] = {"jobID": bad}
            with pytest.raises(UntrustedAnswerError, match="is not a job id"):
                c.submit(b"II*\0 a tiff, as far as the client knows")
        with pytest.raises(UntrustedAnswerError, match="is not a job id"):
            c.status("job-../../x")
        assert not [a for a in _Malicious.asked if "etc" in a or ".." in a]
        # a download longer than its results document said: nothing is left under its name
        out = f"/v1/jobs/{JOB}/outputs/out.tif"
        _Malicious.answers[f"/v1/jobs/{JOB}/results"] = {"classes": {"href": base + out, "size": 4}}
        _Malicious.answers[out] = b"0123456789"
        with pytest.raises(UntrustedAnswerError, match="more than the 4 bytes"):
            c.results(JOB, dest)
        assert list(dest.iterdir()) == []
        _Malicious.answers[out] = b"01"  # and one shorter
        with pytest.raises(GeoServeError, match="2 bytes arrived of the 4 announced"):
            c.results(JOB, dest)
        assert list(dest.iterdir()) == []
        _Malicious.answers[out] = ("redirect", "http://elsewhere.example/out.tif")
        with pytest.raises(UntrustedAnswerError, match="redirected .*elsewhere.*not followed"):
            c.results(JOB, dest)
        assert list(dest.iterdir()) == []
        _Malicious.answers[out] = b"0123"
        assert c.results(JOB, dest) == {"classes": dest / "out.tif"}
        assert (dest / "out.tif").read_bytes() == b"0123"


def test_an_uploaded_part_name_is_only_a_label(
    url: str, scenes: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A part's file name is client text: it never becomes a path on the server."""
    import httpx

    evil = "../../../../escaped_upload.tif"
    with (scenes / "lake.tif").open("rb") as f:
        resp = httpx.post(
            f"{url}/v1/jobs",
            files={"file": (evil, f, "image/tiff")},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["jobID"]
    with geoserve.Client(url, KEY) as c:
        assert c.wait(job_id, poll=0.1).status == "successful"
        outputs = c.results_document(job_id)
    root = tmp_path_factory.getbasetemp()
    assert not list(root.rglob("escaped_upload*"))
    assert not list(root.parent.glob("escaped_upload*"))
    assert outputs.outputs
    assert all("escaped" not in o.href for o in outputs.outputs.values())
