"""What the fault suite (test_faults.py, test_cache_faults.py) needs from the machine: tmpfs
mounts that are read-only or full, another user, and the suite's shared figures.

Mounts need root (and a kernel that allows them here); another user needs root and
``setpriv``. Where the machine lacks either, the tests that need it are skipped with the
reason, and simulated ones (an injected EROFS or ENOSPC) cover the same code.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Counted by both fault files; test_faults.py::test_zz_figures prints them.
FIGURES = {"cases": 0, "jobs run": 0, "jobs in parallel (max)": 0, "collisions refused": 0,
           "kills survived": 0, "faults injected": 0, "internal errors": 0, "bytes lost": 0}

OTHER_UID = 65534  # nobody


def count_internal(rc: int, stderr: str) -> None:
    """Count a run that ended in an internal error (exit 70) or a signal it did not ask for."""
    if rc == 70 or rc < 0 or (rc == 135 and "graphkit: error:" not in stderr) or "internal error" in stderr:
        FIGURES["internal errors"] += 1


def _mount(*args: str) -> str | None:
    """None when it worked, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount program"
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"mount {' '.join(args)}: {proc.stderr.strip()}"


@contextlib.contextmanager
def tmpfs(where: Path, *, size: str = "4m") -> Iterator[Path]:
    """A fresh tmpfs mounted at ``where`` (skips the test when the machine allows no mount)."""
    import pytest

    where.mkdir(parents=True, exist_ok=True)
    why = _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where))
    if why is not None:
        pytest.skip(f"no tmpfs here ({why}); the simulated EROFS/ENOSPC tests cover the code")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def remount(where: Path, *, read_only: bool) -> None:
    why = _mount("-o", f"remount,{'ro' if read_only else 'rw'}", str(where))
    assert why is None, why


def fill(where: Path) -> None:
    """Fill the filesystem of ``where`` until no byte is left (a file named .filler)."""
    fd = os.open(where / ".filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    assert os.statvfs(where).f_bavail == 0


def as_other_user(argv: list[str]) -> list[str]:
    """``argv`` run as uid/gid 65534 with no groups (skips the test where that is impossible).

    setpriv, not os.setuid in a subprocess: this interpreter may live under a directory the
    other user cannot search, and only an exec by setpriv reaches it here."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("running as another user needs root")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as another user needs setpriv (util-linux)")
    cmd = [setpriv, f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv]
    probe = subprocess.run([*cmd[:4], sys.executable, "-c", "import graphkit, os; print(os.getuid())"],
                           capture_output=True, text=True)
    if probe.stdout.strip() != str(OTHER_UID):
        pytest.skip(f"this interpreter cannot run as uid {OTHER_UID}: {probe.stderr.strip()[-200:]}")
    return cmd


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory another user may read and search (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="graphkit-shared-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
