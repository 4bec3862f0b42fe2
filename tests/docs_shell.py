"""The shell commands of docs/*.md as :mod:`tests.test_docs_shell` finds and runs them.

A command is a line of a ``bash`` block (continuation lines, quotes and ``{ ... }`` groups
joined; comment lines dropped), or a ``$ `` line of a block that shows a session.
:func:`served_as_written` starts a documented ``geoserve serve`` command in a subprocess.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.server.conftest import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))


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


def doc_commands(name: str) -> set[str]:
    """The commands of one doc (``"models.md"``)."""
    return {c for c, doc in docs_commands().items() if doc == name}


def argv_of(command: str) -> list[str]:
    """The arguments of a ``geoserve ...`` command (its comment dropped)."""
    words = shlex.split(command, comments=True)
    assert Path(words[0]).name == "geoserve", command
    return words[1:]


@contextmanager
def served_as_written(
    command: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stop: int = signal.SIGTERM,
    timeout: float = 120,
    stop_timeout: float = 60,
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A documented ``geoserve serve`` command in a subprocess of this Python, once ready.

    The port is a free one, not the docs' (a fixed port may be taken on the test machine).
    Yields the base URL and the process; on leaving sends ``stop`` and waits for the exit,
    so ``proc.returncode`` is the command's exit status. Its stderr goes to a file (Ray logs
    every request: a pipe nobody reads would fill and stall it), shown if it fails to start.
    """
    argv = argv_of(command)
    port = free_port()
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    else:
        argv += ["--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "geoserve", *argv],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        try:
            try:
                wait_ready(url, timeout, proc)
            except RuntimeError:
                proc.kill()
                proc.wait()
                log.seek(0)
                raise AssertionError(f"{command}: {log.read()[-3000:]}") from None
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(stop)
            try:
                proc.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
