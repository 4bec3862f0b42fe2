"""Bait for the trust tests: files and a listener that record whether anything touched them.

A VRT document names other files and URLs. :class:`Bait` builds one whose bands come from a
FIFO (opening it for reading is recorded, and a real read would block until we write) and from
``/vsicurl/`` on a loopback listener that counts its connections. A refused input must leave
both untouched.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
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
    b = Bait(tmp_path / "bait")
    try:
        yield b
    finally:
        b.close()
