"""Caches that heal (issue 17): every cached compiled artefact is checked (size, sha256 and
ELF structure) before it is loaded and rebuilt when it does not match; a library that still
does not load is a NativeBuildError (exit 10) naming the path and the fix; a build killed
with SIGKILL takes its compiler with it and leaves nothing a later build trusts.

Faults: bytes flipped in the header with the record rewritten to match, truncated with the
ELF header intact (record rewritten), zero-length (record rewritten), an ELF file of the
wrong kind (record rewritten), a plain mismatch; for the native library, its objects and a
torch extension.

A cache shared between users (issue 29): built by root, used by another user read-only (no
lock, no write); a rebuild that user cannot write is exit 10, a cache on a read-only or full
filesystem exit 4; each one line naming the cache and the fix.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import error_lines, my_add_model
from fault_env import FIGURES, OTHER_UID, as_other_user, count_internal, fill, remount, shared_dir, tmpfs
from graphkit import build_cache
from graphkit.errors import NativeBuildError, OutputError
from graphkit.runtime import native


@pytest.fixture(autouse=True)
def _counted():
    FIGURES["cases"] += 1


def _flip_header(data: bytes) -> bytes:
    out = bytearray(data)
    out[1] ^= 0xFF  # "\x7fELF" -> invalid ELF header
    return bytes(out)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]  # the ELF header (first 64 bytes) survives


FAULTS = {
    "flipped": _flip_header,
    "truncated": _truncate,
    "zero-length": lambda data: b"",
    "wrong-elf": None,  # filled with an object file (ELF, but relocatable, not a shared library)
}


def _inject(entry: build_cache.Entry, name: str, bad: bytes, *, record: str | None = None,
            rewrite_record: bool = True) -> None:
    FIGURES["faults injected"] += 1
    path = entry.path(name)
    tmp = path.with_name(".inject.tmp.x")
    tmp.write_bytes(bad)
    tmp.replace(path)  # os.replace: this process may have the old file mapped
    if rewrite_record:  # the nasty case: a record that matches the damaged file
        fields = entry.record(name, record=record)
        fields.pop("size", None)
        fields.pop("sha256", None)
        entry.write_record(name, record=record, **fields)
        assert json.loads(entry._record_path(name, record).read_text())["size"] == len(bad)


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A cache with graphkit's native library built once; each test works on a copy."""
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("GRAPHKIT_CACHE_DIR")
    os.environ["GRAPHKIT_CACHE_DIR"] = str(root)
    try:
        native.library_path()
    finally:
        if old is None:
            del os.environ["GRAPHKIT_CACHE_DIR"]
        else:
            os.environ["GRAPHKIT_CACHE_DIR"] = old
    return root


@pytest.fixture
def cache(built_cache, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    shutil.copytree(built_cache, root)
    monkeypatch.setenv("GRAPHKIT_CACHE_DIR", str(root))
    return root


def _object_bytes(cache: Path) -> bytes:
    return next((cache / "native" / "obj").glob("*/kernel.o")).read_bytes()


@pytest.mark.parametrize("fault", [*FAULTS, "mismatch"])
def test_native_library_fault_is_rebuilt(cache, fault):
    lib = native.library_path()
    good = lib.read_bytes()
    entry = build_cache.Entry.at(lib.parent)
    if fault == "mismatch":
        _inject(entry, lib.name, _flip_header(good), rewrite_record=False)
    else:
        bad = _object_bytes(cache) if FAULTS[fault] is None else FAULTS[fault](good)
        _inject(entry, lib.name, bad)
        assert build_cache.elf_problem(lib, "shared") is not None
    assert entry.valid(lib.name, elf="shared") is None
    assert native.library_path() == lib
    assert entry.valid(lib.name, elf="shared") == lib and build_cache.elf_problem(lib) is None
    assert native.served_ops(lib) >= {"custom::my_add", "graphkit.native::my_add"}


@pytest.mark.parametrize("fault", FAULTS)
def test_native_object_fault_is_recompiled(cache, fault):
    lib = native.library_path()
    obj = next((cache / "native" / "obj").glob("*/kernel.o"))
    good = obj.read_bytes()
    bad = lib.read_bytes() if FAULTS[fault] is None else FAULTS[fault](good)  # wrong: a shared library
    _inject(build_cache.Entry.at(obj.parent), obj.name, bad)
    build_cache.Entry.at(lib.parent).invalidate(lib.name)
    assert native.library_path() == lib
    assert build_cache.Entry.at(obj.parent).valid(obj.name, elf="object") == obj
    assert native.served_ops(lib) >= {"custom::my_add"}


def _native_model(tmp_path: Path) -> Path:
    from graphkit.rewrite import Lowering, rewrite_model

    out, _ = rewrite_model(my_add_model(), lowering=Lowering.NATIVE)
    path = tmp_path / "m.onnx"
    onnx.save(out, str(path))
    return path


def test_cli_heals_a_corrupt_library_with_a_matching_record(cache, tmp_path):
    """The issue's case: corrupt library, matching checksum -> was exit 70 'invalid ELF header'."""
    lib = native.library_path()
    _inject(build_cache.Entry.at(lib.parent), lib.name, _flip_header(lib.read_bytes()))
    model = _native_model(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "graphkit", "run", str(model)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "GRAPHKIT_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert build_cache.elf_problem(lib) is None


def test_a_library_that_still_does_not_load_is_exit_10(cache, tmp_path):
    """A compiler whose libraries never load (a missing dependency): NativeBuildError, path and fix."""
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (stub_dir / "s.c").write_text("int gk_stub(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(stub_dir / "s.c"), "-o", str(stub_dir / "libgkstub.so")], check=True)
    wrapper = tmp_path / "cxx"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
          *" -shared "*) exec c++ "$@" -L{stub_dir} -Wl,--no-as-needed -lgkstub ;;
          *) exec c++ "$@" ;;
        esac
    """))
    wrapper.chmod(0o755)
    shutil.rmtree(tmp_path / "stub_gone", ignore_errors=True)
    model = _native_model(tmp_path)
    env = {**os.environ, "GRAPHKIT_CACHE_DIR": str(cache), "CXX": str(wrapper)}
    # the library links against libgkstub.so, which the loader cannot find at run time
    proc = subprocess.run([sys.executable, "-m", "graphkit", "run", str(model)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 10, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("graphkit: error: ")]
    assert len(line) == 1 and "libgraphkit_ops.so" in line[0] and "cannot be loaded" in line[0], proc.stderr
    assert "libgkstub.so" in line[0] and "delete" in line[0]
    assert "Traceback" not in proc.stderr


def test_kill_9_during_a_native_build_takes_the_compiler_and_leaves_nothing_trusted(tmp_path):
    cache = tmp_path / "fresh"
    env = {**os.environ, "GRAPHKIT_CACHE_DIR": str(cache)}
    _kill_during_build("from graphkit.runtime import native; native.library_path()", cache, env, start_s=30)
    assert not _compilers_under(cache), "a compiler outlived the killed build"
    time.sleep(0.5)  # nothing recreates files in the cache afterwards
    before = sorted(p.name for p in cache.rglob("*"))
    time.sleep(1.0)
    assert sorted(p.name for p in cache.rglob("*")) == before
    # Nothing half-built is trusted: a record exists only beside a whole artefact it matches
    # (objects compiled before the kill are complete and may be reused); no library is recorded.
    for record in cache.rglob("*.record"):
        artefact = record.name[:-len(".record")]
        assert build_cache.Entry.at(record.parent).valid(artefact, elf="object") is not None, record
        assert artefact.endswith(".o"), record
    done = subprocess.run([sys.executable, "-c", "from graphkit.runtime import native; "
                           "print(native.library_path())"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert build_cache.elf_problem(Path(done.stdout.strip())) is None


def test_kill_9_during_a_torch_extension_build_takes_ninja_and_the_compiler(tmp_path):
    """torch's build runs in a child graphkit watches: ninja and c++ die with the killed process."""
    pytest.importorskip("torch")
    cache = tmp_path / "fresh"
    env = {**os.environ, "GRAPHKIT_CACHE_DIR": str(cache)}
    _kill_during_build("from graphkit.export.extension import load_extension; "
                       "load_extension('my_add', 'graphkit_ops.my_add', ['my_add_torch.cpp'])", cache, env,
                       start_s=60)
    assert not _compilers_under(cache), "ninja or a compiler outlived the killed build"
    assert not _builders_under(cache), "the build's child process outlived the killed build"
    assert not list(cache.rglob("graphkit-build.json"))  # nothing a later load trusts


def _kill_during_build(code: str, cache: Path, env: dict, *, start_s: float) -> None:
    """Run ``code`` (a build) in a process, kill -9 it once a compiler works in ``cache``, and
    give what it started up to 5 s to go."""
    proc = subprocess.Popen([sys.executable, "-c", code], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline and not _compilers_under(cache):
        time.sleep(0.05)
    assert _compilers_under(cache), "the build did not start a compiler"
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (_compilers_under(cache) or _builders_under(cache)):
        time.sleep(0.1)


def _builders_under(cache: Path) -> list[int]:
    """Live python processes building in the cache (graphkit's torch-extension child)."""
    return _live(lambda cmd: b"_extension_child" in cmd and str(cache).encode() in cmd)


def _live(matches) -> list[int]:
    """Pids of live (not zombie) processes, this one aside, whose command line ``matches``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and matches(cmd):
            found.append(int(d.name))
    return found


def _compilers_under(cache: Path) -> list[int]:
    """Live processes whose command line names the cache (compiler driver, cc1plus, as, ld)."""
    return _live(lambda cmd: str(cache).encode() in cmd and b"python" not in cmd.split(b"\0")[0])


# ---- torch extension -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_ext():
    pytest.importorskip("torch")
    from graphkit.export import extension

    extension.load_extension("my_add", "graphkit_ops.my_add", ["my_add_torch.cpp"])
    return extension, extension.extension_build_dir("my_add", "graphkit_ops.my_add", ["my_add_torch.cpp"])


@pytest.mark.parametrize("fault", [*FAULTS, "mismatch"])
def test_torch_extension_fault_is_found_before_import(torch_ext, tmp_path, monkeypatch, fault):
    """A damaged cached extension is never imported (a truncated one died of SIGBUS, exit 135);
    the rebuild starts from nothing the build system could call up to date."""
    extension, build_dir = torch_ext
    copy = tmp_path / build_dir.name
    shutil.copytree(build_dir, copy, ignore=shutil.ignore_patterns(".lock", "lock"))
    entry = build_cache.Entry.at(copy)
    info = entry.record("", record="graphkit-build.json")
    lib = copy / info["library"]
    good = lib.read_bytes()
    if fault == "mismatch":
        _inject(entry, lib.name, _truncate(good), record="graphkit-build.json", rewrite_record=False)
    else:
        bad = _object_bytes_any() if FAULTS[fault] is None else FAULTS[fault](good)
        _inject(entry, lib.name, bad, record="graphkit-build.json")
    imported = []
    monkeypatch.setattr(extension, "_import_library", lambda name, path: imported.append(path))
    assert extension._import_marked(copy, info["module"]) is None
    assert imported == []
    extension._clear_outputs(entry)
    assert not lib.exists() and not (copy / "graphkit-build.json").exists()
    assert (copy / "src").is_dir()


def _object_bytes_any() -> bytes:
    root = build_cache.cache_root() / "native" / "obj"
    found = next(root.glob("*/kernel.o"), None)
    if found is None:
        native.library_path()
        found = next(root.glob("*/kernel.o"))
    return found.read_bytes()


def test_torch_extension_truncated_is_rebuilt_in_a_fresh_process(torch_ext, tmp_path):
    """End to end, in a child process: a truncated cached extension (header intact, record
    rewritten) is rebuilt and works; the process does not die of SIGBUS."""
    extension, build_dir = torch_ext
    cache = tmp_path / "cache"
    shutil.copytree(build_dir, cache / "torch_ext" / build_dir.name, ignore=shutil.ignore_patterns(".lock", "lock"))
    copy = cache / "torch_ext" / build_dir.name
    entry = build_cache.Entry.at(copy)
    info = entry.record("", record="graphkit-build.json")
    _inject(entry, info["library"], _truncate((copy / info["library"]).read_bytes()), record="graphkit-build.json")
    code = ("import torch; from graphkit.export import extension as e; "
            "m = e.load_extension('my_add', 'graphkit_ops.my_add', ['my_add_torch.cpp']); "
            "print(m.my_add(torch.ones(2), torch.ones(2)).tolist())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GRAPHKIT_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[3.0, 3.0]"  # my_add(a, b) = a + 2 b
    assert entry.valid(info["library"], record="graphkit-build.json", elf="shared") is not None
    np.testing.assert_equal(build_cache.elf_problem(copy / info["library"]), None)


# ---- a cache shared between users, read-only or full ------------------------------------------------


def _gk_run(model: Path, cache: Path, *, prefix: tuple[str, ...] = (), cwd: Path | None = None,
            home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRAPHKIT_CACHE_DIR": str(cache)}
    if home is not None:
        env["HOME"] = str(home)
    proc = subprocess.run([*prefix, sys.executable, "-m", "graphkit", "run", str(model), "--seed", "1"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    count_internal(proc.returncode, proc.stderr)
    return proc


def _one_line(proc: subprocess.CompletedProcess, rc: int, *says: str) -> str:
    assert proc.returncode == rc, (proc.returncode, proc.stderr)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("graphkit: error: ") and "Traceback" not in proc.stderr, proc.stderr
    for word in says:
        assert word in lines[0], lines[0]
    FIGURES["faults injected"] += 1
    return lines[0]


def _state(root: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_cache_files_are_readable_by_its_other_users(built_cache):
    """Records and objects carry the umask's permissions (they were mkstemp's 0600: another user
    could not read a record, so every artefact looked invalid to them)."""
    from graphkit.publish import current_umask

    readable = 0o444 & ~current_umask()
    files = [p for p in built_cache.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".record") for p in files)
    for p in files:
        assert p.stat().st_mode & 0o444 == readable, (p, oct(p.stat().st_mode))


@pytest.fixture
def shared(built_cache):
    """(folder, cache, model): root's built cache and a native model, in a folder another user
    can read; a home of that user's own (ONNX Runtime writes there)."""
    with shared_dir() as d:
        cache = d / "cache"
        shutil.copytree(built_cache, cache)  # modes kept: what the build wrote
        cache.chmod(0o755)  # the root was pytest's mkdtemp (0700); graphkit creates it with the umask
        home = d / "home"
        home.mkdir()
        os.chown(home, OTHER_UID, OTHER_UID)
        yield d, cache, _native_model(d)


def test_a_cache_built_by_one_user_is_used_read_only_by_another(shared):
    """The issue's case: `setpriv --reuid=65534 ... graphkit run n.onnx` with root's valid cache
    was exit 70 (PermissionError on the lock file). It runs, takes no lock and writes nothing."""
    d, cache, model = shared
    before = _state(cache)
    proc = _gk_run(model, cache, prefix=tuple(as_other_user([])), cwd=d, home=d / "home")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("z: float32") and error_lines(proc.stderr) == [], proc.stderr
    assert _state(cache) == before
    FIGURES["faults injected"] += 1


def test_a_rebuild_in_a_cache_another_user_owns_is_exit_10(shared):
    """A damaged library must be rebuilt, and this user cannot write the cache: one line naming
    the entry and the fix, exit 10; the cache is left as it was."""
    d, cache, model = shared
    lib = next(cache.glob("native/lib/*/libgraphkit_ops.so"))
    lib.write_bytes(lib.read_bytes()[:1000])  # the record no longer matches
    before = _state(cache)
    proc = _gk_run(model, cache, prefix=tuple(as_other_user([])), cwd=d, home=d / "home")
    line = _one_line(proc, 10, str(lib.parent), "not writable by this user", "$GRAPHKIT_CACHE_DIR", "owner")
    assert "Permission denied" in line
    assert _state(cache) == before


def test_a_valid_artefact_is_loaded_without_the_lock(cache, monkeypatch):
    """No lock, no write: a valid library is returned even where the lock cannot be taken."""
    lib = native.library_path()

    def no_lock(path):
        raise AssertionError(f"the lock {path} was taken to load a valid artefact")

    monkeypatch.setattr(build_cache, "file_lock", no_lock)
    assert native.library_path() == lib


@pytest.mark.parametrize("err,cls,says", [(errno.EACCES, NativeBuildError, "not writable by this user"),
                                          (errno.EROFS, OutputError, "read-only filesystem"),
                                          (errno.ENOSPC, OutputError, "disk is full")],
                         ids=["EACCES", "EROFS", "ENOSPC"])
def test_a_cache_that_cannot_be_written_is_one_error_naming_it(tmp_path, monkeypatch, err, cls, says):
    """Simulated (every machine): the lock file cannot be opened. Permission: exit 10; read-only
    or full filesystem: exit 4, as for every file graphkit writes."""
    entry = build_cache.Entry("native/lib", "k", root=tmp_path)

    def refused(path, *args, **kwargs):
        raise OSError(err, os.strerror(err), str(path))

    monkeypatch.setattr(build_cache, "open", refused, raising=False)
    with pytest.raises(cls, match=says) as info, entry.lock():
        pass
    assert type(info.value) is cls and info.value.exit_code == (10 if cls is NativeBuildError else 4)
    assert str(entry.dir) in str(info.value) and "$GRAPHKIT_CACHE_DIR" in str(info.value)
    FIGURES["faults injected"] += 1


def test_a_cache_on_a_read_only_filesystem(built_cache, tmp_path):
    """Valid: used as it is. Needing a rebuild: exit 4 naming the entry, nothing written."""
    model = _native_model(tmp_path)
    with tmpfs(tmp_path / "ro", size="64m") as root:
        cache = root / "cache"
        shutil.copytree(built_cache, cache)
        remount(root, read_only=True)
        proc = _gk_run(model, cache)
        assert proc.returncode == 0 and error_lines(proc.stderr) == [], proc.stderr
        remount(root, read_only=False)
        lib = next(cache.glob("native/lib/*/libgraphkit_ops.so"))
        lib.write_bytes(lib.read_bytes()[:1000])
        remount(root, read_only=True)
        _one_line(_gk_run(model, cache), 4, str(lib.parent), "read-only filesystem", "$GRAPHKIT_CACHE_DIR")
    FIGURES["faults injected"] += 1


def test_a_cache_on_a_full_filesystem_is_exit_4(built_cache, tmp_path):
    """The objects are cached, the library must be linked, and no byte is left: exit 4 naming
    the entry (the linker's own failure is not reported as a C++ error), no record written."""
    model = _native_model(tmp_path)
    with tmpfs(tmp_path / "full", size="8m") as root:
        cache = root / "cache"
        shutil.copytree(built_cache, cache, ignore=shutil.ignore_patterns("lib"))
        records = sorted(cache.rglob("*.record"))
        fill(root)
        line = _one_line(_gk_run(model, cache), 4, "disk is full", "free some space", str(cache / "native" / "lib"))
        assert sorted(cache.rglob("*.record")) == records, line
        assert not list(cache.rglob("*.so")) and not list(cache.rglob(".*.tmp"))
