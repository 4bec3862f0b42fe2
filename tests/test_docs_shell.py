"""Every shell command of docs/*.md: run as written, or marked here with why it cannot run.

A command is a line of a ``bash`` block (continuation lines, quotes and ``{ ... }`` groups
joined; comment lines dropped), or a ``$ `` line of a block that shows a session. Each one is
in exactly one of :data:`RUN_HERE` (run by this module), :data:`RUN_ELSEWHERE` (run as
written by the test named) or :data:`CANNOT_RUN` (the reason); a command added to the docs and
in none of them fails :func:`test_every_docs_command_is_run_or_marked`.

Commands run in a temporary folder laid out as the repository (``data/`` holds a 256 x 256
corner of the bundled scene, to keep them quick; ``docs/examples`` is copied), in-process
through :func:`geoserve.cli.main` where they end by themselves, in a subprocess for servers
and Ray.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import rasterio

from geoserve.cli import main
from tests.conftest import BUNDLED_SCENE, write_bundled_corner
from tests.multimodal_scenes import write_s1, write_s2
from tests.server.conftest import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))

L1C = "data/S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
PRITHVI = "--model prithvi-eo2-300m-tl-sen1floods11"
HUB_PT = "hf://ibm-nasa-geospatial/Prithvi-EO-2.0-300M-TL-Sen1Floods11/Prithvi-EO-V2-300M-TL-Sen1Floods11.pt"
SHARED_PT = "--weights /shared/weights/Prithvi-EO-V2-300M-TL-Sen1Floods11.pt"

#: Run by this module's tests (the test that runs each is named in its comment).
RUN_HERE = {
    # test_configuration_md_commands
    "geoserve predict scene.tif -o out.tif --config bad.yaml",
    "geoserve predict scene.tif -o out.tif --batch-size 0",
    f"geoserve predict --config docs/examples/predict.yaml {L1C} -o water.tif",
    # test_servers_start_as_the_docs_start_them
    "geoserve serve --config docs/examples/serve.yaml --port 8080 # the flag wins over the file",
    ".venv/bin/geoserve serve --port 8000 # serves demo-water, the default; --model NAME for "
    "another",
    "geoserve serve --model demo-water --ui --output-dir out/ # then open http://127.0.0.1:8000/",
    # test_models_md_modalities
    "geoserve predict -i s2=S2.tif -i s1=S1.tif -o water.tif --model s1s2-water",
    "geoserve predict -i s1=S1.tif -o water.tif --model s1s2-water # radar alone",
    # test_outputs_md_products
    "geoserve predict scene.tif -o products/ --output-kind classes,confidence,polygons,embeddings",
    # test_scaling_md_local_ray_run
    "geoserve predict --ray 'scenes/*.tif' -o outdir/ --model demo-water # local cluster",
}

#: Run as written by another test.
RUN_ELSEWHERE = {
    **dict.fromkeys(
        [
            'REPO=$PWD && cd "$(mktemp -d)" # a scratch folder',
            f'cp "$REPO"/{L1C} scene.tif',
            "curl -sS --fail-with-body -X POST localhost:8000/v1/images -F file=@scene.tif -o "
            "water.tif",
            "curl -sS --fail-with-body -X POST localhost:8000/v1/images -F file=@scene.tif -F "
            'out_data_format=b64_json -F \'options={"output_kind": "probabilities"}\' -o '
            "probabilities.json",
            '{ printf \'{"data": "\'; base64 -w0 scene.tif printf \'", "out_data_format": '
            '"b64_json", "options": {"output_kind": "probabilities"}}\' } > request.json',
            "curl -sS --fail-with-body -X POST localhost:8000/v1/images -H 'content-type: "
            "application/json' -d @request.json -o answer.json",
            "jq -r .data answer.json | base64 -d > probabilities.tif # 2 float32 bands, one per "
            "class",
        ],
        "tests/server/test_docs_commands.py::test_serving_md_commands_work_on_the_bundled_scene",
    ),
    **dict.fromkeys(
        [
            "curl -sS --fail-with-body -X POST localhost:8000/pooling -H 'content-type: "
            'application/json\' -d \'{ "model": "demo-water", "data": {"data": '
            '"https://example.org/scene.tif", "data_format": "url", "out_data_format": '
            '"b64_json", "indices": [1, 2, 3, 8, 11, 12]}, "priority": 0}\'',
            "ID=$(curl -sS --fail-with-body -F file=@scene.tif localhost:8000/v1/scenes | jq -r "
            ".id)",
            "curl -sS --fail-with-body -o tile.png "
            '"localhost:8000/v1/tiles/13/4380/2686.png?source=$ID&kind=classes"',
            "curl -sS --fail-with-body -F file=@scene.tif localhost:8000/v1/scenes | jq -c '{id, "
            "bounds, minzoom, maxzoom}'",
        ],
        "tests/server/test_docs_commands.py::test_serving_md_commands_work_on_the_bundled_scene",
    ),
    **dict.fromkeys(
        [
            "curl -sS --fail-with-body -X POST localhost:8000/v1/images -F s2=@S2.tif -F "
            "s1=@S1.tif -o fused.tif",
            "curl -sS --fail-with-body -X POST localhost:8000/v1/images -H 'content-type: "
            'application/json\' -d \'{"data": {"s2": "scenes/S2.tif", "s1": '
            '"scenes/S1.tif"}, "data_format": "path"}\' -o fused.json',
        ],
        "tests/server/test_docs_commands.py::test_serving_md_modalities_example",
    ),
    **dict.fromkeys(
        [
            f"geoserve predict {L1C} -o dark_water.tif --model example-bright-water",
            "geoserve predict S2B_20230601T101559_L2A.tif S2B_20230701T101559_L2A.tif "
            "--time-series --model example-change -o change.tif",
            "geoserve predict -i s2=s2.tif -i s1=s1.tif -o fused_water.tif --model "
            "example-fusion-water",
            "geoserve info -i s2=s2.tif -i s1=s1.tif --model example-fusion-water",
        ],
        "tests/test_plugins.py::test_docs_plugin_examples_as_installed_plugins",
    ),
}

#: Not run here, and why.
CANNOT_RUN = {
    "./scripts/setup.sh # installs the `server` extra too": "creates the virtual environment "
    "and installs every extra from the package index (minutes, network): the environment "
    "these tests run in is what it makes",
    f"geoserve predict S2_13band.tif -o water.tif {PRITHVI} --weights {HUB_PT}": "downloads "
    "the 1.2 GB checkpoint from the Hugging Face Hub (network)",
    f"geoserve predict S2_13band.tif -o water.tif {PRITHVI} --weights "
    "Prithvi-EO-V2-300M-TL-Sen1Floods11.pt": "needs that 1.2 GB checkpoint on disk",
    "geoserve predict t1.tif t2.tif t3.tif --time-series -o crops.tif --model "
    "prithvi-eo2-300m-tl-crops --weights crops.ckpt": "needs a fine-tuned crops checkpoint "
    "(one of your own)",
    "geoserve predict -i S2L1C=s2_l1c.tif -i S1GRD=s1_db.tif -o water.tif --model "
    "terramind-v1-sen1floods11 --weights terramind_sen1floods11.ckpt": "needs a TerraMind "
    "Sen1Floods11 fine-tune's checkpoint (GBs, one of your own)",
    "geoserve predict -i S1GRD=s1_db.tif -o water.tif --model terramind-v1-sen1floods11 "
    "--weights terramind_sen1floods11.ckpt # radar alone: the mean merge takes any subset": "the "
    "same checkpoint",
    "geoserve predict scene.tif -o classes.tif --config-file config.yaml --weights best.ckpt": (
        "not yet run as written here: tests/test_cli_configured.py runs the same flags on a "
        "fine-tune of its own"
    ),
    'geoserve models --register burns=config.yaml,best.ckpt # listed as "configured"': (
        "not yet run as written here: tests/test_cli_configured.py runs the same flags"
    ),
    "geoserve predict scene.tif -o classes.tif --register burns=config.yaml,best.ckpt --model "
    "burns": "not yet run as written here: tests/test_cli_configured.py runs the same flags",
    "geoserve serve --models-dir models/ --model burns # models/burns/config.yaml + one "
    "checkpoint": "not yet run as written here: "
    "tests/test_cli_configured.py::test_serve_models_dir_registers_and_serves",
    "geoserve bench-accuracy --model MODEL --weights W.ckpt --quantize int8 scene.tif "
    "[--labels labels.tif] [--json]": "a synopsis (MODEL, W.ckpt and [optional] parts are "
    "placeholders); tests/test_cli_bench_accuracy.py runs the command",
    ".venv/bin/python -m bench.gpu --out-dir gpu/ # a few minutes; gpu/gpu.json after every "
    "phase": "needs a CUDA GPU",
    "bash bench/gpu_run.sh # results in $OUT: run.log, checks.json, pytest-gpu.xml, gpu.json, "
    "trace": "the GPU machine's run: needs its wheels and a CUDA GPU",
    "curl -sS -X POST localhost:8000/v1/images -H 'Content-Type: application/json' -d "
    '\'{"data": {"s2": "/data/s2.tif", "s1": "/data/s1.tif"}, "data_format": '
    '"path"}\'': "not yet run as written here: a server of the example-fusion-water plugin; "
    "docs/serving.md's modalities example is run by tests/server/test_docs_commands.py",
    "curl -sS -X POST localhost:8000/v1/images -F s2=@s2.tif -F s1=@s1.tif -o fused_water.tif": (
        "not yet run as written here: as the one above"
    ),
    f"geoserve predict --ray-address auto 'scenes/**/*.tif' -o /shared/out {PRITHVI} "
    f"{SHARED_PT} --gpus-per-actor 1 --ray-actors 8": "needs a running multi-node Ray cluster "
    "with GPUs and shared storage",
    "geoserve serve --ray --replicas 4 --model demo-water --port 8000 # local cluster": "not yet "
    "run as written here (Ray Serve, 4 replicas: minutes on 2 cores); "
    "tests/distributed/test_serving.py serves the same app on Ray Serve",
    "geoserve serve --ray-address auto --replicas 8 --gpus-per-replica 1 "
    f"{PRITHVI} {SHARED_PT} --host 0.0.0.0": "needs a running multi-node Ray cluster with GPUs",
    "curl -sS --fail-with-body -X POST localhost:8000/v1/images -F file=@t1.tif -F file=@t2.tif "
    "-F file=@t3.tif -F dates=2022-04-01,2022-06-15,2022-09-01 -o crops.tif": "needs a "
    "multi-date model's checkpoint (prithvi-eo2-300m-tl-crops); tests/server/test_dates.py "
    "sends these form fields to a stub multi-date model",
    "geoserve predict S2B_33UUU_20200601_0_L2A.json -o water.tif --model ndwi-water": "not yet "
    "run as written here: tests/raster/test_stac.py reads such Items",
    "geoserve predict https://example.org/stac/items/S2B_33UUU_20200601_0_L2A.json -o "
    "water.tif": "an example URL (network)",
    "geoserve predict item.json -o rgb.tif --model identity --bands red,green,blue": "not yet "
    "run as written here: tests/raster/test_stac.py reads such Items",
    "geoserve predict item.json -o out.tif --model identity --bands B05": "not yet run as "
    "written here: tests/raster/test_stac.py checks the message",
}


def _commands(text: str) -> Iterator[str]:
    """The commands of one block's text (see the module docstring)."""
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        pending.append(stripped.removesuffix("\\").strip())
        joined = " ".join(pending)
        depth = sum(1 for p in pending if p.startswith("{")) - sum(
            1 for p in pending if p.startswith("}")
        )
        if stripped.endswith("\\") or joined.count("'") % 2 or depth > 0:
            continue
        yield re.sub(r"\s+", " ", joined)
        pending = []
    if pending:
        yield re.sub(r"\s+", " ", " ".join(pending))


def docs_commands() -> dict[str, str]:
    """Every shell command of docs/*.md -> the doc it is in."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", doc.read_text(), re.S | re.M):
            if lang in ("bash", "sh", "shell", "console"):
                found.update(dict.fromkeys(_commands(body), doc.name))
            elif lang in ("", "text"):  # a session shown: its `$ ` lines
                for line in body.splitlines():
                    if line.startswith("$ "):
                        found[re.sub(r"\s+", " ", line[2:].strip())] = doc.name
    return found


def test_every_docs_command_is_run_or_marked():
    commands = docs_commands()
    assert len(commands) > 30, "the docs lost their commands (or the extraction broke)"
    sets: list[set[str]] = [RUN_HERE, set(RUN_ELSEWHERE), set(CANNOT_RUN)]
    for i, a in enumerate(sets):
        for b in sets[i + 1 :]:
            assert not a & b, f"marked twice: {a & b}"
    marked = set().union(*sets)
    unmarked = {c: doc for c, doc in commands.items() if c not in marked}
    assert not unmarked, f"commands in docs/ neither run by a test nor marked: {unmarked}"
    stale = marked - set(commands)
    assert not stale, f"marked here but in no doc (update the mark): {stale}"


def argv_of(command: str) -> list[str]:
    """The arguments of a ``geoserve ...`` command (its comment dropped)."""
    words = shlex.split(command, comments=True)
    assert Path(words[0]).name == "geoserve", command
    return words[1:]


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A temporary folder laid out as the repository, as the current directory."""
    write_bundled_corner(tmp_path)
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _doc(name: str) -> set[str]:
    return {c for c, doc in docs_commands().items() if doc == name}


def test_configuration_md_commands(repo, capsys):
    page = (ROOT / "docs" / "configuration.md").read_text()
    shutil.copy(BUNDLED_SCENE, "scene.tif")
    Path("bad.yaml").write_text("max_batch_patches: 0\n")
    for command in sorted(c for c in _doc("configuration.md") if " serve " not in c):
        try:
            code = main(argv_of(command))
        except SystemExit as exc:  # a usage error
            code = int(exc.code or 0)
        err = capsys.readouterr().err
        if "bad.yaml" in command or "--batch-size 0" in command:
            assert code in (1, 2), command
            shown = page.split(f"$ {command}\n", 1)[1].splitlines()[0]
            assert shown in err, (command, err)  # the error the page shows
        else:
            assert code == 0, (command, err)
    with rasterio.open("water.tif") as dst:  # predict.yaml: probabilities, a COG
        assert (dst.count, dst.dtypes[0]) == (2, "float32")
        assert dst.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"  # cog: true


def test_models_md_modalities(repo):
    write_s2(repo / "S2.tif", 96)
    write_s1(repo / "S1.tif", 96)
    commands = sorted(c for c in _doc("models.md") if "s1s2-water" in c)
    assert len(commands) == 2
    for command in commands:
        assert main(argv_of(command)) == 0, command
        with rasterio.open("water.tif") as dst, rasterio.open("S2.tif") as s2:
            assert dst.tags()["CLASS_NAMES"] == "not water,water"
            assert (dst.crs, dst.transform) == (s2.crs, s2.transform) or "radar" in command
        Path("water.tif").unlink()


def test_outputs_md_products(repo):
    (command,) = _doc("outputs.md")
    shutil.copy(BUNDLED_SCENE, "scene.tif")
    assert main(argv_of(command)) == 0
    names = sorted(p.name for p in (repo / "products").iterdir())
    for kind in ("classes", "confidence", "polygons", "embeddings"):
        assert any(n.startswith(f"scene_{kind}.") for n in names), (kind, names)


@pytest.mark.parametrize("sub", ["predict", "serve"])
def test_ray_is_a_switch_and_the_address_its_own_flag(sub):
    """``--ray`` never takes the next word (scaling.md's pattern); ``--ray-address`` implies it."""
    from geoserve.cli import build_parser

    parse = build_parser().parse_args
    args = parse([sub, "--ray", *(["scenes/*.tif", "-o", "outdir/"] if sub == "predict" else [])])
    if sub == "predict":
        assert args.inputs == ["scenes/*.tif"]  # not taken for --ray's value
    assert args.ray is True
    assert args.ray_address is None
    args = parse([sub, "--ray-address", "auto", *(["a.tif"] if sub == "predict" else [])])
    assert (args.ray, args.ray_address) == (True, "auto")
    assert parse([sub, *(["a.tif"] if sub == "predict" else [])]).ray is False


@pytest.mark.slow  # a local Ray cluster started and stopped: ~90 s on 2 cores
def test_scaling_md_local_ray_run(repo):
    """The first Ray command as written: ``--ray`` takes no value, so the pattern is the input."""
    pytest.importorskip("ray")
    (command,) = [c for c in _doc("scaling.md") if c in RUN_HERE]
    (repo / "scenes").mkdir()
    for i in range(2):
        write_bundled_corner(repo, 128, name=f"scenes/s{i}.tif")
    res = subprocess.run(
        [sys.executable, "-m", "geoserve", *argv_of(command)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 scene(s) done, 0 skipped (output exists), 0 failed" in res.stdout
    for i in range(2):
        with rasterio.open(repo / "outdir" / f"s{i}_pred.tif") as dst:
            assert dst.tags()["CLASS_NAMES"] == "not water,water"


@pytest.mark.slow  # three servers, each loading its model: ~100 s on 2 cores
def test_servers_start_as_the_docs_start_them(repo):
    """Each ``serve`` command until it is ready. The port is a free one, not the docs' (a fixed
    port may be taken on the test machine); ``.venv/bin/geoserve`` is this Python's."""
    commands = sorted(c for c in RUN_HERE if " serve " in c)
    assert len(commands) == 3
    for command in commands:
        argv = argv_of(command)
        port = free_port()
        if "--port" in argv:
            argv[argv.index("--port") + 1] = str(port)
        else:
            argv += ["--port", str(port)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "geoserve", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_ready(f"http://127.0.0.1:{port}", 120, proc)
        except RuntimeError:
            proc.kill()
            raise AssertionError(f"{command}: {proc.communicate()[1][-2000:]}") from None
        proc.terminate()
        assert proc.wait(timeout=60) == 0, command


def test_a_png_and_a_jpeg_input_warn_once_each_in_geoserve_words(tmp_path):
    """No CRS: geoserve's warning, once per input; none of rasterio's or GDAL's raw ones."""
    with rasterio.open(ROOT / "tests/data/RGB.byte.tif") as src:
        data = src.read(window=((0, 64), (0, 64)))
    for driver, name in (("PNG", "x.png"), ("JPEG", "x.jpg")):
        profile = {"driver": driver, "width": 64, "height": 64, "count": 3, "dtype": "uint8"}
        with rasterio.open(tmp_path / name, "w", **profile) as dst:
            dst.write(data)
    argv = ["predict", "x.png", "x.jpg", "-o", "out", "--model", "identity", "-q"]
    res = subprocess.run(
        [sys.executable, "-m", "geoserve", *argv, "--allowed-formats", "GTiff,PNG,JPEG"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "warning" in line.lower()]
    assert sorted(lines) == [
        f"geoserve: warning: x.{ext}: no CRS or geotransform; the output will not be "
        "georeferenced either"
        for ext in ("jpg", "png")
    ], res.stderr
