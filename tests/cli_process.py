"""The ``geoserve`` command run in this test process, with what a fresh process would show.

A ``python -m geoserve`` subprocess pays the torch and plugin imports (seconds of CPU) each
time. Most CLI tests are about what a command prints and writes, not about the process, so
:func:`run_in_process` runs :func:`geoserve.cli.main` here instead and answers what
:func:`subprocess.run` would: the exit code (a usage error's ``SystemExit`` too) and
everything written to stdout and stderr, at the file descriptors as well (GDAL's or a C
library's own messages), with

- the process's defaults for warnings (or ``PYTHONWARNINGS`` from ``env``), printed to stderr
  as an interpreter prints them, not recorded by pytest;
- the log records ``main()`` configures printed to stderr (pytest's handlers set aside);
- an exception left in a thread, or an unraisable one, printed to stderr as Python's default
  hooks print it;
- ``env`` set and ``cwd`` entered for the call only.

Tests of the process itself (the entry point, start-up imports, signals, a terminal) keep a
real subprocess: :func:`run_subprocess`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO


def run_subprocess(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m geoserve *args`` in a fresh interpreter (``env`` added to this one's)."""
    return subprocess.run(
        [sys.executable, "-m", "geoserve", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def run_in_process(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``geoserve *args`` through :func:`geoserve.cli.main` in this process (see the module)."""
    from geoserve.cli import main

    with (
        _environment(env or {}),
        _directory(cwd),
        _captured() as (out, err),
        _process_warnings(),
        _process_logging(),
        _default_hooks(),
    ):
        try:
            code: Any = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)  # as the interpreter does with sys.exit("message")
            code = 1
    return subprocess.CompletedProcess(list(args), code or 0, out.text, err.text)


class _Stream:
    """One of fd 1 / fd 2 redirected to a temporary file, and ``sys.stdout`` / ``sys.stderr``
    writing there too (line-buffered, so the two keep their order)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.saved = os.dup(fd)
        os.dup2(self.file.fileno(), fd)
        self.stream: TextIO = open(  # noqa: SIM115 - closed in close()
            fd, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False
        )
        self.text = ""

    def close(self) -> None:
        self.stream.close()  # (flushed; fd stays open: closefd=False)
        os.dup2(self.saved, self.fd)
        os.close(self.saved)
        self.file.seek(0)
        self.text = self.file.read().decode("utf-8", errors="replace")
        self.file.close()


@contextlib.contextmanager
def _captured() -> Iterator[tuple[_Stream, _Stream]]:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = sys.stdout, sys.stderr
    out = _Stream(1)
    err = _Stream(2)
    sys.stdout, sys.stderr = out.stream, err.stream
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
        err.close()
        out.close()


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _directory(cwd: Path | None) -> Iterator[None]:
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def _show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
          line: str | None = None) -> None:  # fmt: skip
    """Python's own showwarning: the formatted warning on (this call's) stderr."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _process_warnings() -> Iterator[None]:
    """The filters a fresh interpreter starts with (``PYTHONWARNINGS`` first), and warnings
    printed to stderr; the filters and ``formatwarning`` (which ``main()`` sets) restored."""
    formatwarning = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.resetwarnings()
        # CPython's defaults (Lib/warnings.py), lowest priority first as it installs them
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.simplefilter("ignore", ImportWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        for option in os.environ.get("PYTHONWARNINGS", "").split(","):  # each in front
            if option.strip():
                warnings._setoption(option.strip())  # type: ignore[attr-defined]
        warnings.showwarning = _show
        try:
            yield
        finally:
            warnings.formatwarning = formatwarning


@contextlib.contextmanager
def _process_logging() -> Iterator[None]:
    """No handler on the root logger, as in a fresh process, so ``main()``'s
    ``logging.basicConfig`` prints to this call's stderr; pytest's handlers put back after."""
    root = logging.getLogger()
    plugins = logging.getLogger("geoserve.plugins")
    handlers, level, plugins_level = root.handlers[:], root.level, plugins.level
    root.handlers = []
    try:
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers = handlers
        root.setLevel(level)
        plugins.setLevel(plugins_level)


@contextlib.contextmanager
def _default_hooks() -> Iterator[None]:
    """Python's default thread-exception and unraisable hooks (they print to stderr)."""
    saved = threading.excepthook, sys.unraisablehook
    threading.excepthook, sys.unraisablehook = threading.__excepthook__, sys.__unraisablehook__
    try:
        yield
    finally:
        threading.excepthook, sys.unraisablehook = saved
