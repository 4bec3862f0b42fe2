"""The README's two commands stay true: exactly two, CI runs the second, the demo works."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import rasterio

ROOT = Path(__file__).resolve().parents[1]


def first_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    assert match, "README has no fenced code block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_first_block_is_exactly_two_commands():
    lines = first_block()
    assert len(lines) == 2
    assert "geoserve predict" in lines[0]
    assert "pytest" in lines[1]
    assert "torch==2.14.1 torchvision==0.29.1" in (ROOT / "scripts" / "setup.sh").read_text()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "awk '/^```/{n++; next} n==1' README.md | sed -n 2p" in ci
    assert 'bash -c "$test_cmd"' in ci


def test_demo_command_runs_on_the_bundled_scene(tmp_path):
    demo = first_block()[0].split("&&", 1)[1]
    args = shlex.split(demo)
    assert args[0] == ".venv/bin/geoserve"
    out_index = args.index("-o") + 1
    args[out_index] = str(tmp_path / args[out_index])
    png_index = args.index("--quicklook") + 1
    args[png_index] = str(tmp_path / args[png_index])
    res = subprocess.run(
        [sys.executable, "-m", "geoserve", *args[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    with rasterio.open(args[out_index]) as dst:
        assert (dst.width, dst.height) == (1536, 768)
        assert dst.colormap(1)[1][:3] == (31, 120, 220)
    assert Path(args[png_index]).stat().st_size > 10_000
