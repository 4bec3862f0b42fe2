"""Rewrite one named section of docs/benchmarks.md, leaving the others alone."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nFigures are written by the scripts in `bench/`; rerun them after changes "
    "that move them. Each section names the script and the machine it ran on.\n"
)


def update_section(name: str, body: str) -> None:
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), flags=re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    DOC.write_text(text)
