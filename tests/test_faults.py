"""Fault suite: parallel jobs into one directory, kill -9 and SIGTERM/SIGHUP mid-rewrite,
special and odd output paths, leftovers of killed runs, a full disk, non-UTF-8 model paths;
a read-only or full filesystem under every file graphkit publishes, weights rewritten in
place while a session runs, symlinked outputs, `--ops NAME` beside a folder NAME.

Kept to about two minutes on two cores. GRAPHKIT_FAULTS=N multiplies the rounds (N=1 default):
`GRAPHKIT_FAULTS=10 pytest tests/test_cache_faults.py tests/test_faults.py -s` prints the
suite's figures (tests/fault_env.py: what needs root, a mount or another user).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import REPO, error_lines, my_add_model
from fault_env import FIGURES, count_internal, fill, remount, tmpfs
from graphkit.errors import OutputError
from graphkit.modelio import check_output_path, load_model, save_model
from graphkit.publish import sweep_temporaries, temporary_path

SCALE = max(1, int(os.environ.get("GRAPHKIT_FAULTS", "1") or 1))

@pytest.fixture(autouse=True)
def _counted():
    FIGURES["cases"] += 1

# A job that imports graphkit, says "ready", waits for "go" on stdin, then runs the CLI: the
# jobs of a round start their real work together, and a kill lands in the work, not the imports.
DRIVER = ("import sys; from graphkit.cli import main; import graphkit.modelio, graphkit.external_data, "
          "graphkit.rewrite, onnxruntime; print('ready', flush=True); sys.stdin.readline(); "
          "sys.exit(main(sys.argv[1:]))")


def weights_model(directory: Path, weights: bytes, location: str = "w.bin") -> Path:
    """m.onnx computing y = x + w, w (float32, len(weights)/4) kept in ``location``.

      x   w (external)
       \\ /
      Add -> y
    """
    n = len(weights) // 4
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[n], data_location=TensorProto.EXTERNAL)
    for k, v in {"location": location, "offset": "0", "length": str(4 * n)}.items():
        w.external_data.add(key=k, value=v)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / location).write_bytes(weights)
    (directory / "m.onnx").write_bytes(model.SerializeToString())
    return directory / "m.onnx"


def variant(i: int, mib: float = 8) -> bytes:
    return np.random.default_rng(i).random(int(mib * (1 << 18)), dtype=np.float32).tobytes()


def spawn(*args) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, *map(str, args)], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n", proc.stderr.read()
    return proc


def go(proc: subprocess.Popen) -> None:
    proc.stdin.write(b"go\n")
    proc.stdin.flush()


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith("tmp"))


def assert_complete(model_path: Path, weights: bytes) -> None:
    """The output model loads, and its weights file beside it is exactly ``weights``."""
    model = load_model(model_path)
    location = {e.key: e.value for e in model.graph.initializer[0].external_data}["location"]
    got = (model_path.parent / location).read_bytes()
    n = min(len(got), len(weights))
    lost = int(np.count_nonzero(np.frombuffer(got, np.uint8, n) != np.frombuffer(weights, np.uint8, n)))
    lost += abs(len(got) - len(weights))
    FIGURES["bytes lost"] += lost
    assert lost == 0, f"{model_path} paired with weights that are not its own ({lost} bytes differ)"


# -- parallel jobs: one output directory, one weights name --------------------------------------

@pytest.mark.parametrize("mode", ["copy", "auto"])
def test_parallel_jobs_never_pair_a_model_with_other_weights(tmp_path, mode):
    """Jobs of different models whose weights are all called w.bin write into one directory:
    each exits 0 with its own weights beside its model, or 4 with one line naming w.bin."""
    jobs, rounds = 6, (3 if mode == "copy" else 2) * SCALE
    for r in range(rounds):
        out = tmp_path / f"out{r}"
        out.mkdir()
        # Three weight variants among six jobs: equal weights are shared, different ones refused.
        srcs = [weights_model(tmp_path / f"in{r}-{i}", variant(i % 3)) for i in range(jobs)]
        procs = [spawn("rewrite", src, out / f"m{i}.onnx", "--external-data", mode) for i, src in enumerate(srcs)]
        for p in procs:
            go(p)
        results = [(p.wait(timeout=120), p.stderr.read().decode()) for p in procs]
        for rc, err in results:
            count_internal(rc, err)
        FIGURES["jobs run"] += jobs
        FIGURES["jobs in parallel (max)"] = max(FIGURES["jobs in parallel (max)"], jobs)
        winners = set()
        for i, (rc, err) in enumerate(results):
            if rc == 0:
                assert error_lines(err) == [], err
                assert_complete(out / f"m{i}.onnx", variant(i % 3))
                winners.add(i % 3)
            else:
                assert rc == 4, (i, rc, err)
                lines = error_lines(err)
                assert len(lines) == 1 and "Traceback" not in err, err
                assert "w.bin" in lines[0] and "another directory" in lines[0], lines[0]
                assert not (out / f"m{i}.onnx").exists()
                FIGURES["collisions refused"] += 1
        assert len(winners) == 1, results  # one w.bin: the jobs sharing it succeed, no one else
        assert temporaries(out) == []


def test_a_weights_file_published_meanwhile_is_never_replaced(tmp_path, monkeypatch):
    """Another job publishes its w.bin between our check and our publish: we fail (before: we
    replaced it, and the other job's model silently computed with our weights)."""
    import graphkit.external_data as ed

    src = weights_model(tmp_path / "in", variant(1, 0.1))
    out = tmp_path / "out"
    out.mkdir()
    theirs = variant(2, 0.1)
    real_copy = ed.shutil.copyfile

    def copy_then_race(a, b, *args, **kw):
        result = real_copy(a, b, *args, **kw)
        if not (out / "w.bin").exists():
            (out / "w.bin").write_bytes(theirs)  # the other job wins the race
            FIGURES["faults injected"] += 1
        return result

    monkeypatch.setattr(ed.shutil, "copyfile", copy_then_race)
    with pytest.raises(OutputError, match="w.bin.* is not the model's weights file"):
        save_model(load_model(src), out / "m.onnx", input_path=src, external_data="copy")
    assert (out / "w.bin").read_bytes() == theirs
    assert sorted(p.name for p in out.iterdir()) == ["w.bin"]


def test_identical_existing_weights_are_reused(tmp_path):
    src = weights_model(tmp_path / "in", variant(1, 0.1))
    out = tmp_path / "out"
    out.mkdir()
    (out / "w.bin").write_bytes(variant(1, 0.1))  # same bytes, another file
    save_model(load_model(src), out / "m.onnx", input_path=src, external_data="link")
    assert_complete(out / "m.onnx", variant(1, 0.1))


# -- kill -9, SIGTERM and SIGHUP at random moments -----------------------------------------------

def _rewrite_once(src: Path, out: Path, sig: int, delay: float, mode: str) -> tuple[int, str, float]:
    """(exit code, stderr, seconds from start to exit) of a rewrite sent ``sig`` after ``delay``."""
    proc = spawn("rewrite", src, out / "m.onnx", "--external-data", mode)
    t0 = time.monotonic()
    go(proc)
    if sig:
        time.sleep(delay)
        try:
            proc.send_signal(sig)
            FIGURES["faults injected"] += 1
        except ProcessLookupError:
            pass
    rc = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    if rc != -sig or not sig:
        count_internal(rc, err)
    return rc, err, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_at_a_random_moment_leaves_old_or_complete_output(tmp_path, sig):
    weights = variant(7, 16)
    src = weights_model(tmp_path / "in", weights)
    rng = random.Random(sig)
    # How long the work takes once started: kills are spread over it.
    out = tmp_path / "probe"
    out.mkdir()
    rc, err, span = _rewrite_once(src, out, 0, 0, "copy")
    assert rc == 0, err
    for k in range(4 * SCALE):
        out = tmp_path / f"out{k}"
        out.mkdir()
        mode = ("copy", "auto", "link")[k % 3]
        rc, err, _ = _rewrite_once(src, out, sig, rng.uniform(0, span), mode)
        finished = rc == -sig and sig != signal.SIGKILL
        if finished:  # the default action: before main() installed its handlers or after it restored them
            assert temporaries(out) == [], err
            # before: nothing written (a loaded machine can deliver the signal there); after: complete
            assert (out / "m.onnx").exists() or list(out.iterdir()) == [], err
        elif sig == signal.SIGKILL:
            assert rc in (0, -9), (rc, err)
        else:
            assert rc in (0, 128 + sig), (rc, err)
            if rc:
                assert error_lines(err) == [f"graphkit: interrupted by {signal.Signals(sig).name}"], err
            assert temporaries(out) == []  # the handler's cleanup ran
            if not (out / "m.onnx").exists():
                assert list(out.iterdir()) == [], "a signalled run left a partial output"
        if rc and not finished:
            FIGURES["kills survived"] += 1
        if (out / "m.onnx").exists():
            assert_complete(out / "m.onnx", weights)
        elif (out / "w.bin").exists():
            assert (out / "w.bin").read_bytes() == weights  # published whole or not at all
        # The next run into the directory completes and sweeps what the killed one left.
        rc, err, _ = _rewrite_once(src, out, 0, 0, mode)
        assert rc == 0, err
        assert_complete(out / "m.onnx", weights)
        assert temporaries(out) == []


def test_sigterm_in_process_runs_the_cleanup(tmp_path, capfd):
    """main() turns SIGTERM into an exception: the temporary is removed, exit 143, one line."""
    import graphkit.modelio as mio
    from graphkit.cli import main

    src = weights_model(tmp_path / "in", variant(1, 0.1))
    out = tmp_path / "out"
    out.mkdir()
    real = mio.onnx.ModelProto.SerializeToString

    def serialize_and_get_killed(self, *a, **kw):
        data = real(self, *a, **kw)
        os.kill(os.getpid(), signal.SIGTERM)
        FIGURES["faults injected"] += 1
        return data

    capfd.readouterr()
    try:
        mio.onnx.ModelProto.SerializeToString = serialize_and_get_killed
        rc = main(["rewrite", str(src), str(out / "m.onnx"), "--external-data", "copy"])
    finally:
        mio.onnx.ModelProto.SerializeToString = real
    err = capfd.readouterr().err
    assert rc == 143 and error_lines(err) == ["graphkit: interrupted by SIGTERM"], (rc, err)
    assert list(out.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored


# -- leftovers of killed runs --------------------------------------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_leftovers_of_killed_runs_are_swept_and_live_ones_kept(tmp_path):
    src = weights_model(tmp_path / "in", variant(1, 0.1))
    out = tmp_path / "out"
    out.mkdir()
    mine = temporary_path(out / "w.bin")
    dead = mine.with_name(mine.name.replace(f"-{os.getpid()}-", f"-{_dead_pid()}-"))
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        live = mine.with_name(mine.name.replace(f"-{os.getpid()}-", f"-{sleeper.pid}-"))
        for p in (dead, live, out / ".w.bin.graphkit-tmp"):  # the last: graphkit 0.x's fixed name
            p.write_bytes(b"partial")
        (out / "notes.tmp").write_bytes(b"not graphkit's")
        FIGURES["faults injected"] += 3
        # A legacy leftover no longer blocks a link run ("File exists" before).
        rc, err, _ = _rewrite_once(src, out, 0, 0, "link")
        assert rc == 0, err
        assert_complete(out / "m.onnx", variant(1, 0.1))
        names = set(os.listdir(out))
        assert dead.name not in names and live.name in names and "notes.tmp" in names
        sleeper.kill()
    # Legacy names carry no owner: removed only once stale.
    assert ".w.bin.graphkit-tmp" in names
    import graphkit.publish as publish

    old = publish.STALE_AFTER_S
    publish.STALE_AFTER_S = -1.0
    try:
        removed = {p.name for p in sweep_temporaries(out, ("w.bin",))}
    finally:
        publish.STALE_AFTER_S = old
    assert removed == {".w.bin.graphkit-tmp", live.name}
    assert sorted(os.listdir(out)) == ["m.onnx", "notes.tmp", "w.bin"]


def test_temporary_names_are_recognisable_and_unique(tmp_path):
    a, b = temporary_path(tmp_path / "w.bin"), temporary_path(tmp_path / "w.bin")
    assert a != b and a.parent == tmp_path
    assert a.name.startswith(f".w.bin.graphkit-{os.getpid()}-") and a.name.endswith(".tmp")
    assert len(temporary_path(tmp_path / ("x" * 255)).name) < 256


# -- special and odd outputs ---------------------------------------------------------------------

def _model(tmp_path: Path) -> Path:
    return weights_model(tmp_path / "in", variant(1, 0.01))


def _refused(args, says: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "graphkit", *args], cwd=REPO, capture_output=True, timeout=120)
    err = proc.stderr.decode(errors="replace")
    count_internal(proc.returncode, err)
    assert proc.returncode == 4, (proc.returncode, err)
    lines = error_lines(err)
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err, err
    FIGURES["faults injected"] += 1


def _special(kind: str, path: Path):
    if kind == "fifo":
        os.mkfifo(path)
        return None
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
    return None


@pytest.mark.parametrize("kind,says", [("fifo", "FIFO"), ("socket", "socket"), ("chardev", "character device")])
@pytest.mark.parametrize("command", ["rewrite", "run --output"])
def test_special_file_as_output_is_refused(tmp_path, kind, says, command):
    if kind == "chardev" and os.geteuid() != 0:
        pytest.skip("mknod needs root")
    src = _model(tmp_path)
    target = tmp_path / "o.onnx"
    held = _special(kind, target)
    try:
        args = ["rewrite", src, target] if command == "rewrite" else ["run", src, "--output", target]
        _refused(args, says)
        mode = os.lstat(target).st_mode
        assert not stat.S_ISREG(mode), "the special file was replaced by a regular file"
    finally:
        if held is not None:
            held.close()


def test_dev_null_is_refused_as_an_output():
    with pytest.raises(OutputError, match="character device"):
        check_output_path("/dev/null", None)


def test_trailing_slash_is_refused(tmp_path):
    src = _model(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    _refused(["rewrite", src, f"{out}/new.onnx/"], "trailing slash")
    _refused(["run", src, "--output", f"{out}/y.npz/"], "trailing slash")
    assert list(out.iterdir()) == []


def test_parent_that_is_a_file_is_named(tmp_path):
    src = _model(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    _refused(["rewrite", src, tmp_path / "file.txt" / "o.onnx"], "is a file, not a directory")
    _refused(["rewrite", src, tmp_path / "file.txt" / "sub" / "o.onnx"], "is a file, not a directory")
    assert (tmp_path / "file.txt").read_text() == "x"


def test_run_model_whose_name_is_not_utf8(tmp_path):
    src = _model(tmp_path)
    bad = os.fsencode(src.parent) + b"/m\xff\xfe.onnx"
    os.rename(src, bad)
    for command in (["run"], ["inspect"], ["rewrite"]):
        argv = [os.fsencode(sys.executable), b"-m", b"graphkit", *map(os.fsencode, command), bad]
        if command == ["rewrite"]:
            argv.append(os.fsencode(tmp_path / "o.onnx"))
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr.decode(errors="replace"))
        FIGURES["faults injected"] += 1


# -- a full disk ---------------------------------------------------------------------------------

def test_disk_full_while_copying_weights_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE fails the weights copy with EFBIG, like a full disk: exit 4, nothing left."""
    src = weights_model(tmp_path / "in", variant(3, 1))
    out = tmp_path / "out"
    out.mkdir()
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16)); "
            "from graphkit.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "rewrite", str(src), str(out / "m.onnx"),
                           "--external-data", "copy"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "free some space" in proc.stderr, proc.stderr
    assert list(out.iterdir()) == []
    FIGURES["faults injected"] += 1


# -- a read-only or full filesystem under every file graphkit publishes -------------------------

def _gk(*args, env: dict | None = None, cwd: Path = REPO, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`python -m graphkit ARGS` (internal errors counted)."""
    proc = subprocess.run([sys.executable, *python, "-m", "graphkit", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=None if env is None else {**os.environ, **env})
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


def _picture_models(tmp_path: Path) -> tuple[Path, Path]:
    """m.onnx (custom::my_add) and nat.onnx, its decomposition: a pair `show` draws."""
    if shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed (make sysdeps)")
    from graphkit.rewrite import rewrite_model

    m, nat = tmp_path / "m.onnx", tmp_path / "nat.onnx"
    onnx.save(my_add_model(), m)
    onnx.save(rewrite_model(my_add_model())[0], nat)
    return m, nat


@pytest.fixture
def read_only(tmp_path):
    """A read-only tmpfs holding an empty folder pics/."""
    with tmpfs(tmp_path / "ro") as root:
        (root / "pics").mkdir()
        remount(root, read_only=True)
        yield root


@pytest.fixture
def full(tmp_path):
    """A full tmpfs holding an empty folder pics/ (and the file that fills it)."""
    with tmpfs(tmp_path / "full", size="1m") as root:
        (root / "pics").mkdir()
        fill(root)
        yield root


def test_read_only_filesystem_under_every_output_is_exit_4(tmp_path, read_only):
    """The issue's cases: `show -o RO/pics` and `rewrite --diff RO/pics` were exit 70 (EROFS from
    removing a temporary never created hid the error); a model, weights and outputs too."""
    from graphkit.pictures import write_diff
    from graphkit.publish import atomic_write

    m, nat = _picture_models(tmp_path)
    w = weights_model(tmp_path / "w", variant(1, 0.01))
    out = tmp_path / "out.onnx"
    _one_line(_gk("show", m, nat, "-o", read_only / "pics"), 4, "read-only filesystem", "pics")
    _one_line(_gk("show", m, "-o", read_only / "new"), 4, "read-only filesystem")
    _one_line(_gk("rewrite", m, out, "--diff", read_only / "pics"), 4, "read-only filesystem", "pics")
    assert not out.exists()  # refused before the model was written
    _one_line(_gk("rewrite", m, read_only / "o.onnx"), 4, "read-only filesystem")
    _one_line(_gk("rewrite", w, read_only / "o.onnx", "--external-data", "copy"), 4, "read-only filesystem")
    _one_line(_gk("run", w, "--output", read_only / "y.npz"), 4, "read-only filesystem")
    # Past the CLI's checks: the write itself.
    with pytest.raises(OutputError, match="read-only"):
        write_diff(load_model(m), load_model(nat), read_only / "pics")
    with pytest.raises(OutputError, match="read-only"), atomic_write(read_only / "x.onnx"):
        pass
    FIGURES["faults injected"] += 2
    assert sorted(os.listdir(read_only)) == ["pics"] and os.listdir(read_only / "pics") == []


def test_full_filesystem_under_every_output_is_exit_4(tmp_path, full):
    """No byte left: pictures, a model, its weights and run's outputs are exit 4, nothing left."""
    m, nat = _picture_models(tmp_path)
    w = weights_model(tmp_path / "w", variant(1, 0.01))
    _one_line(_gk("show", m, nat, "-o", full / "pics"), 4, "disk is full", "free some space")
    _one_line(_gk("rewrite", m, full / "o.onnx"), 4, "disk is full")
    _one_line(_gk("rewrite", w, full / "o.onnx", "--external-data", "copy"), 4, "disk is full", "w.bin")
    _one_line(_gk("run", w, "--output", full / "y.npz"), 4, "disk is full")
    assert sorted(os.listdir(full)) == [".filler", "pics"] and os.listdir(full / "pics") == []


def test_a_cleanup_error_never_replaces_the_first_error(tmp_path, monkeypatch):
    """Simulated read-only filesystem (every machine): creating the temporary and removing it
    both fail with EROFS; the error is the OutputError about the write, never the cleanup's."""
    import graphkit.publish as publish

    real_open, real_unlink = os.open, os.unlink

    def refused(real):
        def call(path, *args, **kwargs):
            if ".graphkit-" in os.fsdecode(path):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr(publish.os, "open", refused(real_open))
    monkeypatch.setattr(publish.os, "unlink", refused(real_unlink))
    for name in ("m.onnx", ".region-001-before.svg", "y.npz"):
        with pytest.raises(OutputError, match="read-only") as info:
            with publish.atomic_write(tmp_path / name) as tmp:
                tmp.write_bytes(b"x")
        assert str(tmp_path / name) in str(info.value)
        FIGURES["faults injected"] += 1
    monkeypatch.undo()
    # A write failing for want of space, then a cleanup failing: the first error stays.
    monkeypatch.setattr(publish.os, "unlink", refused(real_unlink))
    with pytest.raises(OutputError, match="disk is full"), publish.atomic_write(tmp_path / "o.onnx"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    FIGURES["faults injected"] += 1


# -- weights rewritten in place while a session runs ---------------------------------------------

# Opens a session on argv[1], damages w.bin beside it (argv[2]), runs on zeros and saves y = w.
_SESSION_THEN = """
import os, sys, numpy as np
from graphkit.runtime import open_session
s = open_session(sys.argv[1])
w = os.path.join(os.path.dirname(sys.argv[1]), "w.bin")
if sys.argv[2] == "truncate":
    os.truncate(w, 0)
else:
    with open(w, "r+b") as f:
        f.write(bytes(os.path.getsize(w)))  # zeros, in place, same size
n = s.inputs[0].shape[0]
np.save(sys.argv[3], s.run({"x": np.zeros(n, np.float32)})["y"])
"""


@pytest.mark.parametrize("fault", ["truncate", "in-place"])
def test_weights_changed_under_a_session_are_read_not_mapped(tmp_path, fault):
    """The weights were read before the session was created: truncated (SIGBUS, exit 135,
    before) or rewritten in place meanwhile, the run computes with the weights it opened with."""
    weights = variant(5, 4)
    model = weights_model(tmp_path / "in", weights)
    proc = subprocess.run([sys.executable, "-c", _SESSION_THEN, model, fault, tmp_path / "y.npy"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    count_internal(proc.returncode, proc.stderr)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert np.load(tmp_path / "y.npy").tobytes() == weights
    FIGURES["faults injected"] += 1


def test_mapped_weights_truncated_under_a_session_are_one_line_and_exit_135(tmp_path):
    """Above $GRAPHKIT_WEIGHTS_READ_LIMIT ONNX Runtime maps the file: a truncation is SIGBUS,
    reported in one line naming the file (before: a silent signal)."""
    model = weights_model(tmp_path / "in", variant(5, 4))
    proc = subprocess.run([sys.executable, "-c", _SESSION_THEN, model, "truncate", tmp_path / "y.npy"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "GRAPHKIT_WEIGHTS_READ_LIMIT": "0"})
    assert proc.returncode == 135, (proc.returncode, proc.stderr)
    line = _one_line(proc, 135, "'w.bin'", "bus error", str(model), "GRAPHKIT_WEIGHTS_READ_LIMIT")
    assert "never in place" in line
    assert not (tmp_path / "y.npy").exists()


def test_weights_rewritten_while_graphkit_run_runs(tmp_path):
    """The issue's probe: `cat w2.bin > w.bin` while `graphkit run --inputs --output` runs (12
    of 24 runs died of SIGBUS, exit 135, before). Here three rewrites land at random moments of
    each run: it exits 0 with the outputs of one whole version of the weights (never a mix), or
    3 naming w.bin; never a signal."""
    import threading

    versions = (variant(11, 16), variant(12, 16))
    model = weights_model(tmp_path / "in", versions[0])
    for i, data in enumerate(versions):
        (tmp_path / f"w{i}.bin").write_bytes(data)
    np.savez(tmp_path / "x.npz", x=np.zeros(len(versions[0]) // 4, np.float32))
    rng = random.Random(29)

    def run(k: int, rewrite_in: float | None) -> tuple[int, str, float]:
        out = tmp_path / f"y{k}.npz"
        proc = spawn("run", model, "--inputs", tmp_path / "x.npz", "--output", out)
        writer = None
        if rewrite_in is not None:
            def rewrite():
                for i in range(3):
                    time.sleep(rng.uniform(0, rewrite_in / 3))
                    subprocess.run(f"cat '{tmp_path}/w{(k + i + 1) % 2}.bin' > '{tmp_path}/in/w.bin'", shell=True,
                                   check=True)
                    FIGURES["faults injected"] += 1
            writer = threading.Thread(target=rewrite)
        t0 = time.monotonic()
        go(proc)
        if writer is not None:
            writer.start()
        rc = proc.wait(timeout=120)
        span = time.monotonic() - t0
        if writer is not None:
            writer.join()
        err = proc.stderr.read().decode()
        count_internal(rc, err)
        if rc == 0:
            with np.load(out) as y:
                assert y["y"].tobytes() in versions, "the outputs mix two versions of the weights"
        else:
            _one_line(subprocess.CompletedProcess([], rc, "", err), 3, "w.bin")
            assert not out.exists()
        return rc, err, span

    rc, err, span = run(-1, None)  # how long a run takes, once started
    assert rc == 0, err
    codes = [run(k, span)[0] for k in range(6 * SCALE)]
    assert 0 in codes, codes


def test_weights_of_a_model_lowered_in_memory_are_found_from_another_directory(tmp_path):
    """`run --bind` opens the lowered model from memory: its weights are read from the model's
    folder, not the working directory (exit 3, "'w.bin' is missing", before)."""
    model = weights_model(tmp_path / "in", variant(1, 0.01))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _gk("run", model, "--bind", "python", cwd=elsewhere)
    assert proc.returncode == 0 and proc.stdout.startswith("y: float32"), proc.stderr


def test_weights_read_limit_is_checked(tmp_path, monkeypatch):
    from graphkit.errors import UsageError
    from graphkit.runtime import _weights

    for text, limit in (("", 2 << 30), ("0", 0), ("4K", 4096), ("2g", 2 << 30), ("512MiB", 512 << 20), ("123", 123)):
        monkeypatch.setenv("GRAPHKIT_WEIGHTS_READ_LIMIT", text)
        assert _weights.read_limit() == limit, text
    monkeypatch.setenv("GRAPHKIT_WEIGHTS_READ_LIMIT", "lots")
    with pytest.raises(UsageError, match="GRAPHKIT_WEIGHTS_READ_LIMIT"):
        _weights.read_limit()
    model = weights_model(tmp_path / "in", variant(1, 0.01))
    _one_line(_gk("run", model, env={"GRAPHKIT_WEIGHTS_READ_LIMIT": "lots"}), 2, "GRAPHKIT_WEIGHTS_READ_LIMIT")
    assert _gk("run", model, env={"GRAPHKIT_WEIGHTS_READ_LIMIT": "0"}).returncode == 0  # mapped


def test_weights_truncated_or_changing_while_read_are_exit_3(tmp_path, monkeypatch):
    """Read before the session: a file shorter than the model needs is exit 3 naming it; a file
    whose size or times change during the read is read again, and refused if it never settles."""
    from graphkit.errors import ModelLoadError
    from graphkit.runtime import _weights

    w = tmp_path / "w.bin"
    w.write_bytes(b"\1" * 50)  # the model was checked against 100 bytes, then the file shrank
    with pytest.raises(ModelLoadError, match="'w.bin' was truncated while it was read .50 of the 100"):
        _weights.read_external_data({"w.bin": w}, {"w.bin": 100}, "m.onnx")
    w.write_bytes(b"\1" * 100)
    stamps = iter(range(100))
    monkeypatch.setattr(_weights, "_version", lambda st: next(stamps))  # a different version every time
    monkeypatch.setattr(_weights.time, "sleep", lambda s: None)
    with pytest.raises(ModelLoadError, match="'w.bin' kept changing while it was read"):
        _weights.read_external_data({"w.bin": w}, {"w.bin": 100}, "m.onnx")
    settles = iter([1, 2, 3, 3])
    monkeypatch.setattr(_weights, "_version", lambda st: next(settles))  # changed once, then settled
    assert _weights.read_external_data({"w.bin": w}, {"w.bin": 100}, "m.onnx")["w.bin"].tobytes() == b"\1" * 100
    FIGURES["faults injected"] += 3


# -- a symlink as an output ----------------------------------------------------------------------

@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
@pytest.mark.parametrize("command", ["rewrite", "run --output", "show -o"])
def test_a_symlinked_output_is_replaced_and_its_target_left_alone(tmp_path, command, dangling):
    """Documented (docs/guarantees.md, "Symlinks as outputs"): graphkit replaces the link by a
    regular file; it never writes through it."""
    target = tmp_path / "elsewhere" / "target"
    target.parent.mkdir()
    if not dangling:
        target.write_bytes(b"the link's target")
    if command == "show -o":
        m, _ = _picture_models(tmp_path)
        (tmp_path / "pics").mkdir()
        link = tmp_path / "pics" / "graph.svg"
        args = ["show", m, "-o", tmp_path / "pics"]
    else:
        m = _model(tmp_path)
        link = tmp_path / ("o.onnx" if command == "rewrite" else "y.npz")
        args = ["rewrite", m, link] if command == "rewrite" else ["run", m, "--output", link]
    link.symlink_to(target)
    proc = _gk(*args)
    assert proc.returncode == 0, proc.stderr
    assert not link.is_symlink() and link.is_file() and link.stat().st_size > 0
    if dangling:
        assert not target.exists()
    else:
        assert target.read_bytes() == b"the link's target"
    FIGURES["faults injected"] += 1


# -- --ops NAME beside a folder NAME ---------------------------------------------------------------

def test_ops_names_a_package_folder_in_the_working_directory(tmp_path):
    """An op project's usual layout: `myops/` holding the package, run from its parent. `--ops
    myops`, `--ops myops:PACKAGE` and `GRAPHKIT_OPS=myops` were exit 13 "no such file"."""
    work = tmp_path / "project"
    (work / "myops").mkdir(parents=True)
    (work / "myops" / "__init__.py").write_text("from .defs import OTHER, PACKAGE\n")
    (work / "myops" / "defs.py").write_text("from graphkit.ops import OpPackage\n"
                                            "PACKAGE = OpPackage(name='myops', ops=())\n"
                                            "OTHER = OpPackage(name='myops_other', ops=())\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "plain.py").write_text("from graphkit.ops import OpPackage\nPACKAGE = OpPackage(name='plain', ops=())\n")
    (work / "plain").mkdir()  # a folder without __init__.py: the name is the module's
    (work / "empty").mkdir()
    env = {"GRAPHKIT_OPS": "", "PYTHONPATH": os.pathsep.join(filter(None, (str(lib), os.environ.get("PYTHONPATH"))))}

    def packages(*args, extra_env=None):
        # -P: the working directory is not on sys.path, as for the installed `graphkit` script
        proc = _gk("ops", "--json", *args, cwd=work, env={**env, **(extra_env or {})}, python=("-P",))
        assert proc.returncode == 0, (args, proc.stderr)
        return {p["name"]: p["origin"] for p in json.loads(proc.stdout)["packages"]}

    assert packages("--ops", "myops")["myops"] == "--ops"
    assert packages("--ops", "myops:PACKAGE")["myops"] == "--ops"
    assert packages("--ops", "./myops/")["myops"] == "--ops"
    assert packages("--ops", f"{work / 'myops'}:OTHER")["myops_other"] == "--ops"
    assert packages("--ops", "myops.defs:OTHER")["myops_other"] == "--ops"
    assert packages(extra_env={"GRAPHKIT_OPS": "myops"})["myops"] == "$GRAPHKIT_OPS"
    assert packages("--ops", "plain")["plain"] == "--ops"
    line = _one_line(_gk("ops", "--ops", "empty", cwd=work, env=env, python=("-P",)), 13, "empty")
    assert "folder without __init__.py" in line
    line = _one_line(_gk("ops", "--ops", "./empty", cwd=work, env=env, python=("-P",)), 13, "empty")
    assert "folder without __init__.py" in line


def test_zz_figures():
    """Printed with -s: the suite's figures (internal errors and bytes lost must be 0)."""
    print("\nfault suite figures:", ", ".join(f"{k} {v}" for k, v in FIGURES.items()))
    assert FIGURES["bytes lost"] == 0 and FIGURES["internal errors"] == 0
