"""What a new user meets first: start-up without torch, the model list, early input errors."""

import json
import os
import subprocess
import sys
import threading

import pytest

from geoserve.catalog import format_table, model_entries
from tests.cli_process import run_in_process
from tests.test_cli import run

HEAVY = ("torch", "timm", "geoserve_prithvi")


def imported_after(*argv: str) -> tuple[int, set[str], str]:
    """Run the CLI in a fresh interpreter; its exit code, which heavy modules it imported,
    and what it printed to stderr."""
    code = (
        "import sys\n"
        "from geoserve.cli import main\n"
        "try:\n"
        f"    rc = main({list(argv)!r})\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules], rc)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("HEAVY "), res.stdout + res.stderr
    heavy, rc = last[6:].rsplit(" ", 1)
    return int(rc), set(eval(heavy)), res.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["predict", "--help"],
        ["serve", "--help"],
        ["predict"],  # missing arguments: a usage error
        ["serve", "--port", "many"],
        ["predict", "x.tif", "-o", "y.tif", "--allowed-formats", "VRT"],
    ],
)
def test_help_and_usage_errors_do_not_import_torch(argv):
    rc, heavy, _ = imported_after(*argv)
    assert rc in (0, 2)
    assert heavy == set()


def test_info_without_a_model_does_not_import_torch(make_geotiff):
    rc, heavy, err = imported_after("info", str(make_geotiff()))
    assert rc == 0, err
    assert heavy == set()


def test_a_missing_input_is_reported_before_the_model_loads(tmp_path):
    gone = tmp_path / "gone.tif"
    rc, heavy, err = imported_after("predict", str(gone), "-o", str(tmp_path / "o.tif"))
    assert rc == 1
    assert err.strip() == f"geoserve: error: {gone}: no such file"
    assert heavy == set()


def test_an_input_that_is_not_a_raster_is_reported_before_the_model_loads(tmp_path):
    text = tmp_path / "notes.tif"
    text.write_text("not a raster\n")
    rc, heavy, err = imported_after("predict", str(text), "-o", str(tmp_path / "o.tif"))
    assert rc == 1
    assert f"{text}: not a readable raster" in err
    assert heavy == set()


def test_one_missing_input_of_several_fails_alone_and_keeps_the_output_layout(
    tmp_path, make_geotiff
):
    good = make_geotiff(name="good.tif")
    out = tmp_path / "out"
    res = run("predict", str(tmp_path / "gone.tif"), str(good), "-m", "identity", "-o", str(out))
    assert res.returncode == 1
    assert f"{tmp_path / 'gone.tif'}: no such file" in res.stderr
    assert "1 of 2 inputs done, 1 failed" in res.stdout
    assert (out / "good_pred.tif").is_file()  # still a directory of outputs


def read_terminal(argv: list[str]) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal; exit code and what the terminal got."""
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the other side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, "-m", "geoserve", *argv],
        stdout=subprocess.PIPE,
        stderr=slave,
        timeout=300,
    )
    os.close(slave)
    reader.join(10)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def test_loading_a_model_is_announced_on_a_terminal_only(tmp_path, make_geotiff):
    src = make_geotiff()
    rc, terminal = read_terminal(
        ["predict", str(src), "-m", "identity", "-o", str(tmp_path / "a.tif")]
    )
    assert rc == 0, terminal
    assert "loading model identity…" in terminal  # importing torch alone takes seconds
    res = run("predict", str(src), "-m", "identity", "-o", str(tmp_path / "b.tif"))
    assert res.returncode == 0, res.stderr
    assert "loading model" not in res.stderr


def test_models_fits_100_columns_and_shortens_long_class_lists():
    res = run_in_process("models", env={"COLUMNS": "100"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].split() == ["MODEL", "PLUGIN", "BANDS", "OUTPUT", "WEIGHTS"]
    table = lines[: lines.index("")]  # (below it: the output kinds each group offers)
    rows = {line.split()[0]: line for line in table if not line.startswith(" ")}
    assert rows["ndwi-water"].split()[1:3] == ["geoserve", "B3,B8"]
    crops = rows["prithvi-eo2-300m-tl-crops"]
    assert " ".join(crops.split()[1:]) == "geoserve-prithvi 0-5 (3 dates) 13 classes required"
    assert "Natural Vegetation" not in res.stdout


def test_models_json_has_every_detail():
    res = run("models", "--json")
    assert res.returncode == 0, res.stderr
    entries = {e["name"]: e for e in json.loads(res.stdout)}
    crops = entries["prithvi-eo2-300m-tl-crops"]
    assert (len(crops["classes"]), crops["num_frames"]) == (13, 3)
    assert (crops["plugin"], crops["weights"]) == ("geoserve-prithvi", "required")
    assert entries["ndwi-water"]["bands"] == ["B3", "B8"]
    assert entries["identity"]["bands"] is None


def test_plugin_models_without_weights_say_none():
    entries = {e.name: e for e in model_entries()}
    assert entries["test-box"].plugin == "tests"  # registered by this suite's own module
    assert entries["test-box"].weights == "none"
    assert entries["identity"].weights == "built in"


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
def test_the_model_table_fits_any_width(width):
    entries = model_entries()
    lines = format_table(entries, width)
    assert max(len(line) for line in lines) <= width
    shown = {line.split()[0] for line in lines[1:] if not line.startswith(" ")}
    assert shown == {e.name for e in entries}
