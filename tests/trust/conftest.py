"""Bait for the trust tests: files and a listener that record whether anything touched them.

A VRT document names other files and URLs. :class:`Bait` builds one whose bands come from a
FIFO (opening it for reading is recorded, and a real read would block until we write) and from
``/vsicurl/`` on a loopback listener that counts its connections. A refused input must leave
both untouched.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


class Listener:
    """A TCP listener on 127.0.0.1 that counts connections and answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.connections = 0
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


class Tripwire:
    """A FIFO whose opening by a reader is recorded (a writer thread waits for one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.opened = threading.Event()
        self._done = False
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)  # blocks until someone opens it for reading
        if not self._done:
            self.opened.set()
            with contextlib.suppress(OSError):
                os.write(fd, b"\x01" * 4096)
        os.close(fd)

    def close(self) -> None:
        self._done = True  # release the writer thread with our own, uncounted, reader
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)


class Bait:
    """A secret file, a FIFO tripwire and a counting listener, and VRTs that point at them."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.secret = root / "secret.txt"
        self.secret.write_bytes(b"TOP-SECRET-" * 100)
        self.fifo = Tripwire(root / "tripwire")
        self.listener = Listener()

    def vrt(self, *, only_secret: bool = False) -> bytes:
        """A VRT with a raw band from the FIFO, one from the secret file, one from the URL.

        ``only_secret``: just the secret file's band (a VRT that GDAL reads to the end, so
        without the allow-list its bytes would come back as pixels).
        """
        url = f"/vsicurl/http://127.0.0.1:{self.listener.port}/scene.tif"
        raw = (
            '<VRTRasterBand dataType="Byte" band="{band}" subClass="VRTRawRasterBand">'
            '<SourceFilename relativetoVRT="0">{src}</SourceFilename>'
            "<ImageOffset>0</ImageOffset><PixelOffset>1</PixelOffset>"
            "<LineOffset>32</LineOffset></VRTRasterBand>"
        )
        remote = (
            '<VRTRasterBand dataType="Byte" band="3"><SimpleSource>'
            f'<SourceFilename relativeToVRT="0">{url}</SourceFilename>'
            "<SourceBand>1</SourceBand></SimpleSource></VRTRasterBand>"
        )
        if only_secret:
            return (
                '<VRTDataset rasterXSize="32" rasterYSize="32">'
                + raw.format(band=1, src=self.secret)
                + "</VRTDataset>"
            ).encode()
        return (
            '<VRTDataset rasterXSize="32" rasterYSize="32">'
            + raw.format(band=1, src=self.fifo.path)
            + raw.format(band=2, src=self.secret)
            + remote
            + "</VRTDataset>"
        ).encode()

    def untouched(self) -> bool:
        return not self.fifo.opened.is_set() and self.listener.connections == 0

    def close(self) -> None:
        self.fifo.close()
        self.listener.close()


@pytest.fixture
def bait(tmp_path: Path) -> Iterator[Bait]:
    with contextlib.closing(Bait(tmp_path / "bait")) as b:
        yield b


def can_mount() -> bool:
    """Whether this test run may mount a tmpfs (root with CAP_SYS_ADMIN, as in CI)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(tempfile.mkdtemp(prefix="geoserve-mount-"))
    try:
        ok = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)]
        ).returncode
        if ok == 0:
            subprocess.run(["umount", str(probe)], check=True)
        return ok == 0
    finally:
        probe.rmdir()


class OutputDir:
    """A directory that a test can make read-only (and writable again) while a server runs.

    As root it is a real tmpfs remounted ``ro`` (root ignores permission bits); otherwise
    its permission bits are cleared, which an unprivileged server cannot bypass.
    """

    def __init__(self, path: Path, size: str = "64m") -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.mounted = can_mount()
        if self.mounted:
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True
            )

    def read_only(self) -> None:
        """Everything done through the path from now on is refused (EROFS).

        A read-only bind mount over the directory: unlike remounting the tmpfs itself, this
        works while a file in it is open for writing, as on a real disk that fails mid-run.
        """
        if self.mounted:
            p = str(self.path)
            subprocess.run(["mount", "--bind", p, p], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", p], check=True)
        else:
            self.path.chmod(0o555)

    def writable(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.path)], check=True)  # the read-only layer
        else:
            self.path.chmod(0o755)

    def close(self) -> None:
        if self.mounted:
            while os.path.ismount(self.path):
                subprocess.run(["umount", "-l", str(self.path)], check=False)
        else:
            self.path.chmod(0o755)


def small_disk(path: Path, size_bytes: int) -> tuple[Path, Callable[[], None] | None]:
    """An output directory where writes past ``size_bytes`` fail, for a child process.

    As root: a real tmpfs of that size (ENOSPC). Otherwise: the child gets an RLIMIT_FSIZE
    of that size (EFBIG), returned as a ``preexec_fn``. Both are real kernel write failures.
    """
    path.mkdir(parents=True, exist_ok=True)
    if can_mount():
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)], check=True
        )
        return path, None

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size_bytes, size_bytes))

    return path, limit


def unmount(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], check=False)
