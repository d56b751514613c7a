"""Fault suite: parallel jobs into one directory, kill -9 and SIGTERM/SIGHUP mid-rewrite,
special and odd output paths, leftovers of killed runs, a full disk, non-UTF-8 model paths.

Kept under a minute on two cores. GRAPHKIT_FAULTS=N multiplies the rounds (N=1 default):
`GRAPHKIT_FAULTS=10 pytest tests/test_faults.py -s` prints the suite's figures.
"""

from __future__ import annotations

import os
import random
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

from conftest import REPO, error_lines
from graphkit.errors import OutputError
from graphkit.modelio import check_output_path, load_model, save_model
from graphkit.publish import sweep_temporaries, temporary_path

SCALE = max(1, int(os.environ.get("GRAPHKIT_FAULTS", "1") or 1))
FIGURES = {"jobs run": 0, "jobs in parallel (max)": 0, "collisions refused": 0, "kills survived": 0,
           "faults injected": 0, "bytes lost": 0}

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
    return rc, proc.stderr.read().decode(), time.monotonic() - t0


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


def test_zz_figures():
    """Printed with -s: the suite's figures (bytes lost must be 0)."""
    print("\nfault suite figures:", ", ".join(f"{k} {v}" for k, v in FIGURES.items()))
    assert FIGURES["bytes lost"] == 0
