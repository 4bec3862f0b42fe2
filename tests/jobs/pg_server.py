"""A throwaway PostgreSQL server for the job store's tests (Debian's ``postgresql`` package).

``PgServer.start()`` makes a cluster in a fresh folder under the system's temporary folder
(``initdb``, trust authentication), starts it on a free port of 127.0.0.1 with its Unix socket
in that folder, and ``stop()`` stops it and removes the folder. PostgreSQL refuses to run as
root, so a root caller runs it as the ``postgres`` user (else ``nobody``), which owns the folder.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are missing: the PostgreSQL job store's "
    "tests start a real server. Install them with scripts/setup_jobs.sh "
    "(apt-get install -y postgresql), or put initdb and pg_ctl on PATH"
)


def find_bin_dir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: the newest Debian install, else PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_user() -> pwd.struct_passwd | None:
    """The user to run the server as: ``None`` (the caller) unless the caller is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists")


@dataclass
class PgServer:
    """One running cluster; ``dsn(dbname)`` names a database on it over TCP."""

    bin_dir: Path
    root: Path
    port: int
    user: pwd.struct_passwd | None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / "server.log"

    @classmethod
    def start(cls, bin_dir: Path) -> PgServer:
        root = Path(tempfile.mkdtemp(prefix="geoserve-pg-"))
        server = cls(bin_dir, root, _free_port(), _server_user())
        if server.user is not None:
            os.chown(root, server.user.pw_uid, server.user.pw_gid)
        try:
            server._run(
                "initdb", "-D", str(root / "data"), "-U", "geoserve", "--auth=trust",
                "-E", "UTF8", "--no-sync",
            )  # fmt: skip
            options = (
                f"-c listen_addresses=127.0.0.1 -p {server.port} -k {root} -c fsync=off"
                " -c max_connections=100"
            )
            server._run(
                "pg_ctl", "-D", str(root / "data"), "-l", str(server.log), "-w", "-t", "60",
                "-o", options, "start",
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def _run(self, tool: str, *args: str) -> None:
        as_other = self.user is not None
        done = subprocess.run(
            [str(self.bin_dir / tool), *args],
            capture_output=True,
            text=True,
            check=False,
            cwd=self.root,
            user=self.user.pw_uid if self.user else None,
            group=self.user.pw_gid if self.user else None,
            extra_groups=[] if as_other else None,
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr}{log}")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://geoserve@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
