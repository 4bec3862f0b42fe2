"""Every shell command of docs/*.md: run as written, or marked here with why it cannot run.

The commands are found as :mod:`tests.docs_shell` says. Each one is in exactly one of
:data:`RUN_HERE` (run by this module), :data:`RUN_ELSEWHERE` (run as written by the test
named) or :data:`CANNOT_RUN` (the reason); a command added to the docs and in none of them
fails :func:`test_every_docs_command_is_run_or_marked`.

Commands run in a temporary folder laid out as the repository (``data/`` holds a 256 x 256
corner of the bundled scene, to keep them quick; ``docs/examples`` is copied), with the files
they name written there (a fine-tune, STAC Items, toy scenes: small ones), in-process through
:func:`geoserve.cli.main` where they end by themselves, in a subprocess for servers and Ray.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import rasterio

from geoserve.cli import main
from geoserve.models.configured import unregister_configured
from geoserve.registry import MODEL_REGISTRY
from tests.cli_process import run_in_process
from tests.conftest import BUNDLED_SCENE, write_bundled_corner
from tests.docs_shell import argv_of, doc_commands, docs_commands, served_as_written
from tests.multimodal_scenes import write_s1, write_s2
from tests.stac_items import write_s2_item
from tests.test_cli_configured import expected_classes, write_fine_tune, write_scene
from tests.test_plugins import make_plugin, plugin_doc

ROOT = Path(__file__).resolve().parents[1]

L1C = "data/S2_L1C_T33UUU_20170216T102101_13band_10m.tif"
PRITHVI = "--model prithvi-eo2-300m-tl-sen1floods11"
HUB_PT = "hf://ibm-nasa-geospatial/Prithvi-EO-2.0-300M-TL-Sen1Floods11/Prithvi-EO-V2-300M-TL-Sen1Floods11.pt"
SHARED_PT = "--weights /shared/weights/Prithvi-EO-V2-300M-TL-Sen1Floods11.pt"
SERVE_RAY = "geoserve serve --ray --replicas 4 --model demo-water --port 8000 # local cluster"

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
    # test_models_md_fine_tune_commands
    "geoserve predict scene.tif -o classes.tif --config-file config.yaml --weights best.ckpt",
    'geoserve models --register burns=config.yaml,best.ckpt # listed as "configured"',
    "geoserve predict scene.tif -o classes.tif --register burns=config.yaml,best.ckpt --model "
    "burns",
    "geoserve serve --models-dir models/ --model burns # models/burns/config.yaml + one checkpoint",
    # test_plugins_md_fusion_server
    "geoserve serve --model example-fusion-water --allowed-input-dir . --port 8000",
    "curl -sS --fail-with-body -X POST localhost:8000/v1/images -H 'Content-Type: "
    'application/json\' -d \'{"data": {"s2": "s2.tif", "s1": "s1.tif"}, "data_format": '
    '"path"}\' -o fused_water.json',
    "curl -sS --fail-with-body -X POST localhost:8000/v1/images -F s2=@s2.tif -F s1=@s1.tif -o "
    "fused_water.tif",
    # test_stac_md_local_items
    "geoserve predict S2B_33UUU_20200601_0_L2A.json -o water.tif --model ndwi-water",
    "geoserve predict item.json -o rgb.tif --model identity --bands red,green,blue",
    "geoserve predict item.json -o out.tif --model identity --bands B05",
}

#: Run as written by another test.
RUN_ELSEWHERE = {
    "curl -sS --fail-with-body -X POST localhost:8000/v1/images -H 'serve_multiplexed_model_id: "
    "ndwi-water' -F file=@scene.tif -o water.tif": (
        "tests/server/test_docs_commands.py::test_scaling_md_model_header_command"
    ),
    "geoserve predict -i S2L2A=s2_l2a.tif -o scene.tif --model terramind-v1-tiny-generate "
    "--output-kind lulc,confidence --seed 7 # scene_lulc.tif, scene_confidence.tif": (
        "tests/models/terramind/test_generate_hub.py::test_generation_md_command"
    ),
    f"geoserve predict {L1C} -o water --output-kind classes,confidence,polygons --stac-item": (
        "tests/test_stac_result.py::test_outputs_md_stac_item_command"
    ),
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
            "JOB=$(curl -sS --fail-with-body -X POST localhost:8000/v1/jobs -F file=@scene.tif "
            "| jq -r .jobID)",
            "curl -sS --fail-with-body localhost:8000/v1/jobs/$JOB | jq -c '{status, progress, "
            "message}'",
            "while curl -sS --fail-with-body localhost:8000/v1/jobs/$JOB | jq -e '.status == "
            '"accepted" or .status == "running"\' > /dev/null; do sleep 1; done',
            "curl -sS --fail-with-body localhost:8000/v1/jobs/$JOB/results -o results.json # "
            '{"classes": {"href": ".../outputs/out.tif", ...}, "stac-item": ...}',
            'curl -sS --fail-with-body -o job_water.tif "$(jq -r .classes.href results.json)"',
            "curl -sS --fail-with-body -H 'Prefer: return=representation' "
            "localhost:8000/v1/jobs/$JOB/results -o inline.json # small outputs inline",
            "jq -r .classes.value inline.json | base64 -d > inline_water.tif # the same bytes "
            "as job_water.tif",
            "curl -sS --fail-with-body -X DELETE localhost:8000/v1/jobs/$JOB | jq -r .status # "
            "dismissed: its files are removed",
            "curl -sS --fail-with-body -D headers.txt -o status.json -X POST "
            "localhost:8000/ogcapi/processes/demo-water/execution -H 'Content-Type: "
            "application/json' -H 'Prefer: respond-async' -d '{\"inputs\": {\"image\": "
            '{"href": "https://example.org/scene.tif"}}}\'',
            "grep -i '^location:' headers.txt # Location: "
            "http://localhost:8000/ogcapi/jobs/job-...",
        ],
        "tests/server/test_jobs_docs.py::test_serving_md_jobs_commands",
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
    "geoserve info --stac https://earth-search.aws.element84.com/v1 --collection "
    "sentinel-2-l2a --bbox 11.98,44.99,12.02,45.01 --datetime 2024-06-01/2024-06-30 --model "
    "ndwi-water": "asks Earth Search (network); tests/test_stac_search.py runs the same flags "
    "against a local STAC API",
    "geoserve predict --stac https://earth-search.aws.element84.com/v1 --collection "
    "sentinel-2-l2a --bbox 11.98,44.99,12.02,45.01 --datetime 2024-06-01/2024-06-30 "
    "--max-cloud 40 --model ndwi-water -o water.tif": "asks Earth Search and reads its "
    "Sentinel-2 files (network); tests/test_stac_search.py runs the same flags against a local "
    "STAC API",
    "pip install 'geoserve[xarray]'": "installs from the package index (network); the "
    "environment these tests run in has the extra (scripts/setup.sh installs it)",
    "geoserve predict -i S2L2A=s2_l2a.tif -o scene.tif --model terramind-v1-tiny-generate "
    "--output-kind s1grd,dem,lulc --seed 7 # + radar and a DEM: 50 UNet steps a patch each": (
        "downloads two 0.8 GB diffusion tokenizers and runs 100 UNet calls (~190 GFLOP each) "
        "per 224 px patch: a GPU's work; test_generation_md_command runs the LULC line"
    ),
    "geoserve serve --model terramind-v1-base-generate --output-kind s1grd,lulc --device cuda": (
        "needs a CUDA GPU and the base checkpoints from the Hub"
    ),
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
    "geoserve bench-accuracy --model MODEL --weights W.ckpt --quantize int8 scene.tif "
    "[--labels labels.tif] [--json]": "a synopsis (MODEL, W.ckpt and [optional] parts are "
    "placeholders); tests/test_cli_bench_accuracy.py runs the command",
    ".venv/bin/python -m bench.gpu --out-dir gpu/ # a few minutes; gpu/gpu.json after every "
    "phase": "needs a CUDA GPU",
    "bash bench/gpu_run.sh # results in $OUT: run.log, checks.json, pytest-gpu.xml, gpu.json, "
    "trace": "the GPU machine's run: needs its wheels and a CUDA GPU",
    f"geoserve predict --ray-address auto 'scenes/**/*.tif' -o /shared/out {PRITHVI} "
    f"{SHARED_PT} --gpus-per-actor 1 --ray-actors 8": "needs a running multi-node Ray cluster "
    "with GPUs and shared storage",
    SERVE_RAY: "4 replicas reserve a CPU each (and load an engine each, ~0.95 GB resident): "
    "on this 2-core machine Ray Serve places 2 and leaves 2 waiting for CPUs (measured: ready "
    "after ~35 s with 2 of 4 running); test_scaling_md_serve_on_ray runs the line with "
    "--replicas 1",
    "geoserve serve --ray-address auto --replicas 8 --gpus-per-replica 1 "
    f"{PRITHVI} {SHARED_PT} --host 0.0.0.0": "needs a running multi-node Ray cluster with GPUs",
    "curl -sS --fail-with-body -X POST localhost:8000/v1/images -F file=@t1.tif -F file=@t2.tif "
    "-F file=@t3.tif -F dates=2022-04-01,2022-06-15,2022-09-01 -o crops.tif": "needs a "
    "multi-date model's checkpoint (prithvi-eo2-300m-tl-crops); tests/server/test_dates.py "
    "sends these form fields to a stub multi-date model",
    "geoserve predict https://example.org/stac/items/S2B_33UUU_20200601_0_L2A.json -o "
    "water.tif": "an example URL (network)",
}


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
    for test in set(RUN_ELSEWHERE.values()):  # each names a test that exists
        path, name = test.split("::")
        assert f"\ndef {name}(" in (ROOT / path).read_text(), test


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A temporary folder laid out as the repository, as the current directory."""
    write_bundled_corner(tmp_path)
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_configuration_md_commands(repo, capsys):
    page = (ROOT / "docs" / "configuration.md").read_text()
    shutil.copy(BUNDLED_SCENE, "scene.tif")
    Path("bad.yaml").write_text("max_batch_patches: 0\n")
    for command in sorted(c for c in doc_commands("configuration.md") if " serve " not in c):
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
    commands = sorted(c for c in doc_commands("models.md") if "s1s2-water" in c)
    assert len(commands) == 2
    for command in commands:
        assert main(argv_of(command)) == 0, command
        with rasterio.open("water.tif") as dst, rasterio.open("S2.tif") as s2:
            assert dst.tags()["CLASS_NAMES"] == "not water,water"
            assert (dst.crs, dst.transform) == (s2.crs, s2.transform) or "radar" in command
        Path("water.tif").unlink()


def test_outputs_md_products(repo):
    (command,) = doc_commands("outputs.md") & RUN_HERE
    shutil.copy(BUNDLED_SCENE, "scene.tif")
    assert main(argv_of(command)) == 0
    names = sorted(p.name for p in (repo / "products").iterdir())
    for kind in ("classes", "confidence", "polygons", "embeddings"):
        assert any(n.startswith(f"scene_{kind}.") for n in names), (kind, names)


@pytest.fixture
def forget_registered():
    """Models the commands register in this process are unregistered after the test."""
    before = set(MODEL_REGISTRY.names())
    yield
    for name in set(MODEL_REGISTRY.names()) - before:
        unregister_configured(name)


def test_models_md_fine_tune_commands(repo, capsys, forget_registered):
    """A TerraTorch fine-tune's config.yaml + best.ckpt, beside it and in models/burns/."""
    _, _, reference = write_fine_tune(repo / "models" / "burns", "best.ckpt")
    for name in ("config.yaml", "best.ckpt"):
        shutil.copy(repo / "models" / "burns" / name, name)
    scene = write_scene(repo / "scene.tif")
    commands = {c for c in doc_commands("models.md") & RUN_HERE if "s1s2-water" not in c}
    assert len(commands) == 4
    for command in sorted(c for c in commands if " serve " not in c):
        Path("classes.tif").unlink(missing_ok=True)
        assert main(argv_of(command)) == 0, (command, capsys.readouterr().err)
        if " models " in command:
            (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("burns ")]
            assert line.split()[1] == "configured", line
            continue
        with rasterio.open("classes.tif") as dst:
            assert dst.tags()["CLASS_NAMES"] == "unburned,burned,cloud", command
            np.testing.assert_array_equal(dst.read(1), expected_classes(reference, scene))
    (serve,) = [c for c in commands if " serve " in c]
    with served_as_written(serve) as (url, _):
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "burns"
        resp = httpx.post(f"{url}/v1/images", files={"file": ("s.tif", scene.read_bytes())})
    assert resp.status_code == 200, resp.text
    with rasterio.MemoryFile(resp.content) as mem, mem.open() as ds:
        np.testing.assert_array_equal(ds.read(1), expected_classes(reference, scene))


@pytest.mark.skipif(not shutil.which("curl"), reason="the docs' requests need curl")
def test_plugins_md_fusion_server(repo, tmp_path_factory):
    """The example-fusion-water plugin (docs/plugins.md's module, on a path with its entry
    point), served as the page says, and both requests as written, from the folder of s2.tif
    and s1.tif."""
    (fusion,) = [m for m in plugin_doc() if "example-fusion-water" in m["module"][0]]
    site = tmp_path_factory.mktemp("site")
    make_plugin(site, "doc_fusion", "doc_fusion", fusion["module"][0] + "\ndef register(): pass\n")
    write_s2(repo / "s2.tif")
    write_s1(repo / "s1.tif")
    commands = doc_commands("plugins.md") & RUN_HERE
    (serve,) = [c for c in commands if " serve " in c]
    requests = sorted(c for c in commands if c.startswith("curl "))
    assert len(requests) == 2
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    with served_as_written(serve, env={"PYTHONPATH": path}) as (url, proc):
        for request in requests:
            script = request.replace("localhost:8000", url.removeprefix("http://"))
            res = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
            assert res.returncode == 0, (request, res.stderr)
    assert proc.returncode == 0
    with rasterio.open("fused_water.tif") as dst, rasterio.open("s2.tif") as s2:
        assert (dst.crs, dst.transform, dst.shape) == (s2.crs, s2.transform, s2.shape)
        assert dst.tags()["CLASS_NAMES"] == "land,water"
        fused = dst.read(1)
    assert abs((fused == 1).mean() - np.pi / 16) < 0.01  # the toy scenes' water disc
    answer = json.loads(Path("fused_water.json").read_text())
    with rasterio.MemoryFile(base64.b64decode(answer["data"])) as mem, mem.open() as dst:
        np.testing.assert_array_equal(dst.read(1), fused)  # the paths read the same files


def test_stac_md_local_items(repo, capsys):
    """Items and their band files (one per band, 10 m and 20 m) as a catalogue lays them out."""
    page = (ROOT / "docs" / "stac.md").read_text()
    for name in ("S2B_33UUU_20200601_0_L2A.json", "item.json"):
        write_s2_item(repo, 64, name=name)
    commands = doc_commands("stac.md") & RUN_HERE
    assert len(commands) == 3
    for command in sorted(commands):
        code = main(argv_of(command))
        err = capsys.readouterr().err
        if "B05" in command:  # the error the page shows, but for where the Item is
            assert code == 1, command
            shown = page.split(f"$ {command}\n", 1)[1].split("\n```", 1)[0]
            assert err.strip() == " ".join(shown.splitlines()).replace(
                "/data/item.json", str(repo / "item.json")
            )
            continue
        assert code == 0, (command, err)
    with rasterio.open("water.tif") as dst, rasterio.open("B03.tif") as b03:
        assert (dst.crs, dst.transform, dst.shape) == (b03.crs, b03.transform, b03.shape)
        assert dst.tags()["CLASS_NAMES"] == "not water,water"
    with rasterio.open("rgb.tif") as dst:
        rgb = dst.read()
    for i, band in enumerate(("B04", "B03", "B02")):  # red, green, blue: by common name
        with rasterio.open(f"{band}.tif") as src:
            np.testing.assert_array_equal(rgb[i], src.read(1).astype(np.float32))


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
    (command,) = [c for c in doc_commands("scaling.md") if c in RUN_HERE]
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


def test_scaling_md_serve_on_ray(repo):
    """The documented ``serve --ray`` line with one replica (CANNOT_RUN says why not 4): Ray
    Serve's proxy answers as ``geoserve serve`` does, and Ctrl-C stops the local cluster."""
    pytest.importorskip("ray")
    from geoserve import Engine

    assert SERVE_RAY in doc_commands("scaling.md")
    scene = repo / BUNDLED_SCENE
    with served_as_written(
        SERVE_RAY.replace("--replicas 4", "--replicas 1"),
        stop=signal.SIGINT,
        stop_timeout=180,  # Ray Serve's graceful shutdown took over 60 s on a loaded machine
    ) as (url, proc):
        resp = httpx.post(
            f"{url}/v1/images", files={"file": ("s.tif", scene.read_bytes())}, timeout=120
        )
    assert proc.returncode == 130  # interrupted, as a user's Ctrl-C
    assert resp.status_code == 200, resp.text
    expected = Engine("demo-water").generate_image(scene, out_format="tensor").outputs.tensor
    with rasterio.MemoryFile(resp.content) as mem, mem.open() as ds:
        np.testing.assert_array_equal(ds.read(1), expected.numpy()[0])


@pytest.mark.slow  # three servers, each loading its model: ~100 s on 2 cores
def test_servers_start_as_the_docs_start_them(repo):
    """Each ``serve`` command until it is ready. The port is a free one, not the docs' (a fixed
    port may be taken on the test machine); ``.venv/bin/geoserve`` is this Python's."""
    commands = sorted(c for c in doc_commands("configuration.md") | doc_commands("serving.md"))
    commands = [c for c in commands if " serve " in c]
    assert len(commands) == 3
    for command in commands:
        with served_as_written(command) as (_, proc):
            pass
        assert proc.returncode == 0, command


def test_a_png_and_a_jpeg_input_warn_once_each_in_geoserve_words(tmp_path):
    """No CRS: geoserve's warning, once per input; none of rasterio's or GDAL's raw ones."""
    with rasterio.open(ROOT / "tests/data/RGB.byte.tif") as src:
        data = src.read(window=((0, 64), (0, 64)))
    for driver, name in (("PNG", "x.png"), ("JPEG", "x.jpg")):
        profile = {"driver": driver, "width": 64, "height": 64, "count": 3, "dtype": "uint8"}
        with rasterio.open(tmp_path / name, "w", **profile) as dst:
            dst.write(data)
    argv = ["predict", "x.png", "x.jpg", "-o", "out", "--model", "identity", "-q"]
    res = run_in_process(*argv, "--allowed-formats", "GTiff,PNG,JPEG", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if "warning" in line.lower()]
    assert sorted(lines) == [
        f"geoserve: warning: x.{ext}: no CRS or geotransform; the output will not be "
        "georeferenced either"
        for ext in ("jpg", "png")
    ], res.stderr
