"""`graphkit simplify` against onnxslim, onnxsim and onnxoptimizer on real exports (issue 26).

    python bench/simplify.py [--small] [--models bert,dcn_resnet] [--exporters torchscript]
                             [--shapes static,dynamic] [--runs 10] [--json out.json]
                             [--graphkit-cmd "graphkit"] [--no-install]

The corpus is tests/simplify_models.py's (BERT, GPT-2, ViT, LLaMA, ResNet-50, the DCN
ResNet with ``custom::deform_conv2d``, a ResNet with ``custom::my_add``), each exported by
graphkit's export with both torch exporters, static and with dynamic batch/sequence
dimensions (``--small``: the test suite's tiny configs; default: 4 layers of hidden 256,
sequence 128, images 224x224). Per model, in one run, side by side:

- the original export;
- ``graphkit simplify IN OUT`` (``--graphkit-cmd`` overrides ``graphkit``; "n/a" where the
  command does not exist);
- ``onnxslim IN OUT``, ``onnxsim IN OUT`` and ``python -m onnxoptimizer IN OUT`` (its
  fuse-and-elimination passes), each with its defaults, from their own virtual
  environment, ``bench/.contenders-venv`` (it ignores itself in git), created on the first
  run (``pip install onnxslim onnxsim onnxoptimizer onnxruntime``; never graphkit's
  dependencies; ``--no-install``: skip the contenders that are absent).

Each tool runs as a subprocess: its wall time and peak RSS (``os.wait4``'s rusage) are its
own. Every output, the original's included, is opened with ``graphkit.runtime.open_session``
(graphkit's kernels registered for custom ops), 1 intra-op thread, and:

- its outputs on the entry's feeds (a dynamic model: two shapes) are compared with the
  original's in ONNX Runtime (the original's own row: with torch eager), max abs difference
  and that over the output's largest magnitude;
- its latency: median of ``--runs`` runs at the first feed (batch 1, sequence 128 /
  image 224) with graph optimizations disabled (ORT_DISABLE_ALL) and enabled
  (ORT_ENABLE_ALL), the models of an entry taking turns run by run; the running thread's
  CPU time (what the ratios use: with 1 intra-op thread all of a run's work is on it, and
  neighbours on a shared machine hardly change it; with ``--threads`` above 1 it is the
  calling thread's share only) and wall time; graphkit's output is timed a second time, in
  a session of its own taking its turns with the others (the control: "same model twice",
  what two equal models differ by on this machine at that moment).

Then the ratios issue 26 asks for, per model: graphkit's node count over the best
contender's, graphkit's wall time over onnxslim's, graphkit's CPU time per run over the
best contender's. A contender counts as "best" only where its output runs and matches the
original (atol 1e-4 + rtol 1e-3 of the output's scale). A failure (an export, a tool, a
session) is recorded with its first or last error line; the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the corpus the tests export

import numpy as np  # noqa: E402
import onnx  # noqa: E402

CONTENDERS = ("onnxslim", "onnxsim", "onnxoptimizer")
TOOLS = ("original", "graphkit", *CONTENDERS)
VENV = ROOT / "bench" / ".contenders-venv"
PACKAGES = ("onnxslim", "onnxsim", "onnxoptimizer", "onnxruntime")
ATOL, RTOL = 1e-4, 1e-3


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class Tool:
    """A simplifier: ``command + [IN, OUT]`` runs it; ``command`` None: unavailable (``reason``)."""

    name: str
    command: tuple[str, ...] | None
    reason: str = ""


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_contenders(venv: Path = VENV, *, install: bool = True,
                      log: Callable[[str], None] = _log) -> dict[str, Tool]:
    """The contenders in ``venv``, created and installed into on first use when ``install``.

    Each package is installed on its own, so one that cannot be installed (onnxsim builds
    from source where pip finds no wheel) leaves the others usable."""
    python = _venv_python(venv)
    marker = venv / ".bench-installed"
    if not marker.exists() and install:
        if not python.exists():
            log(f"creating {venv} (contenders, not graphkit's dependencies)")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            (venv / ".gitignore").write_text("*\n")  # the venv ignores itself
        for package in PACKAGES:
            log(f"pip install {package} into {venv.name}")
            done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                   package], capture_output=True, text=True)
            if done.returncode:
                log(f"  failed: {_last_line(done.stderr or done.stdout)}")
        marker.write_text("")
    tools = {}
    for name in CONTENDERS:
        if not python.exists():
            tools[name] = Tool(name, None, f"absent: no {venv.name}" + (" (--no-install)" if not install else ""))
            continue
        module = {"onnxsim": "onnxsim", "onnxslim": "onnxslim", "onnxoptimizer": "onnxoptimizer"}[name]
        found = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True)
        if found.returncode:
            tools[name] = Tool(name, None, f"absent: {_last_line(found.stderr)}")
        elif name == "onnxoptimizer":
            tools[name] = Tool(name, (str(python), "-m", "onnxoptimizer"))  # its CLI, default passes
        else:
            tools[name] = Tool(name, (str(venv / "bin" / name),))
    return tools


def contender_versions(venv: Path = VENV) -> dict[str, str]:
    python = _venv_python(venv)
    if not python.exists():
        return {}
    code = ("import importlib.metadata as m, json\nv = {}\nfor p in %r:\n    try: v[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: pass\nprint(json.dumps(v))" % (PACKAGES,))
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def graphkit_tool(command: Sequence[str] | None = None) -> Tool:
    """``graphkit simplify`` (n/a where the command does not exist yet)."""
    if command is None:
        local = Path(sys.executable).parent / "graphkit"
        command = [str(local)] if local.exists() else [sys.executable, "-m", "graphkit"]
    argv = (*command, "simplify")
    try:
        probe = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Tool("graphkit", None, f"n/a: {exc}")
    if probe.returncode:
        return Tool("graphkit", None, f"n/a: {_last_line(probe.stderr or probe.stdout)}")
    return Tool("graphkit", argv)


@dataclass
class Process:
    returncode: int
    seconds: float
    peak_rss_mib: float | None
    output: str


# Spawns the tool and reports its own wall time and rusage. The tool is forked from this
# small process, not from the bench (torch loaded): Linux counts the RSS a child had before
# exec in its ru_maxrss, which would give every tool the bench's size.
_LAUNCHER = """
import json, os, sys, time
start = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    json.dump({"returncode": os.waitstatus_to_exitcode(status), "seconds": seconds, "maxrss_kib": usage.ru_maxrss}, f)
"""


def run_process(argv: Sequence[str], timeout: float) -> Process:
    """Run ``argv``; its wall time and peak RSS (its own rusage, from wait4 in a launcher)."""
    with tempfile.TemporaryDirectory(prefix="simplify-run-") as tmp, open(Path(tmp) / "out", "w+b") as out:
        report = Path(tmp) / "report.json"
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCHER, str(report), *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the tool
            proc.wait()
        seconds = time.perf_counter() - start
        out.seek(0)
        text = out.read().decode(errors="replace")
        if not report.exists():  # killed, or the tool could not be started
            return Process(proc.returncode or -9, seconds, None,
                           text + (f"\ntimed out after {timeout:.0f} s" if seconds >= timeout else ""))
        done = json.loads(report.read_text())
    return Process(done["returncode"], done["seconds"], done["maxrss_kib"] / 1024, text)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _error_line(text: str) -> str:
    """The line of a tool's output that says what failed: the last one naming an error."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or "exception" in line.lower() or "fail" in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else "(no output)"


# --------------------------------------------------------------------------- measuring


@dataclass
class Row:
    """One tool on one corpus entry."""

    model: str
    exporter: str
    shapes: str
    tool: str
    status: str = "ok"  # ok, failed, n/a, skipped, ort failed
    nodes: int | None = None
    seconds: float | None = None
    peak_rss_mib: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None  # max abs difference over the output's largest magnitude
    matches: bool | None = None
    # median milliseconds of a run by graph optimization level ("disabled", "enabled"):
    latency_ms: dict[str, float] = field(default_factory=dict)  # wall
    cpu_ms: dict[str, float] = field(default_factory=dict)  # the running thread's CPU time
    # graphkit's row: the same output in a second session, timed in the same turns (the noise)
    control_cpu_ms: dict[str, float] = field(default_factory=dict)
    error: str = ""


def count_nodes(model: onnx.ModelProto) -> int:
    """Nodes of the main graph, of its If/Loop/Scan bodies and of model-local functions."""

    def graph(g: onnx.GraphProto) -> int:
        return sum(1 + sum(graph(a.g) if a.type == onnx.AttributeProto.GRAPH else
                           sum(graph(s) for s in a.graphs) for a in n.attribute) for n in g.node)

    return graph(model.graph) + sum(len(f.node) for f in model.functions)


def _session(path: Path, optimize: bool, threads: int):
    import onnxruntime as ort

    from graphkit.runtime import open_session

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return open_session(path, options=so, threads=threads, unknown_domains=False)


def _outputs(session, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(session.run(feeds).values())


def _latencies(timed: Sequence[tuple[Row, Path]], feeds: dict[str, np.ndarray], runs: int, threads: int,
               sessions_per_model: int = 1) -> None:
    """Median wall and CPU milliseconds of one run of each model, at both optimization levels.

    The models take turns, run by run (a different one first each round), so load from
    neighbours drifting during the measurement hits them all alike. CPU time is this
    thread's: with 1 intra-op thread ONNX Runtime runs every kernel on the caller's thread,
    so it is the run's own work, which other processes on the machine hardly change.
    ``sessions_per_model`` above 1: each model gets that many sessions, each timed ``runs``
    times, the median taken over all of them (two sessions of one file differ by a few
    percent here: where ONNX Runtime's buffers land)."""
    from simplify_models import first_line

    for level in ("disabled", "enabled"):
        sessions = []
        for row, path in timed:
            if row.status != "ok":
                continue
            wall_ms: list[float] = []
            cpu_ms: list[float] = []
            try:
                for _ in range(sessions_per_model):
                    session = _session(path, optimize=level == "enabled", threads=threads)
                    for _ in range(2):  # warm-up
                        _outputs(session, feeds)
                    sessions.append((row, session, wall_ms, cpu_ms))
            except Exception as exc:  # noqa: BLE001 - recorded in the table
                row.status, row.error = "ort failed", f"ORT ({level} optimizations): {first_line(exc)}"
                sessions = [s for s in sessions if s[0] is not row]
                continue
        for i in range(runs if sessions else 0):
            for row, session, wall, cpu in sessions[i % len(sessions):] + sessions[:i % len(sessions)]:
                start, start_cpu = time.perf_counter(), time.thread_time()
                _outputs(session, feeds)
                cpu.append(time.thread_time() - start_cpu)
                wall.append(time.perf_counter() - start)
        for row, _, wall, cpu in {id(s[2]): s for s in sessions}.values():  # (a model's sessions share lists)
            if wall:
                row.latency_ms[level] = statistics.median(wall) * 1e3
                row.cpu_ms[level] = statistics.median(cpu) * 1e3
        del sessions


def _difference(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> tuple[float, float, bool]:
    """Max abs difference, that over the reference's largest magnitude, and whether every
    output is within ATOL + RTOL * its scale (over every feed)."""
    worst_abs = worst_rel = 0.0
    ok = True
    for g_outs, w_outs in zip(got, want):
        if len(g_outs) != len(w_outs):
            raise ValueError(f"{len(g_outs)} outputs, the original has {len(w_outs)}")
        for g, w in zip(g_outs, w_outs):
            if g.shape != w.shape:
                raise ValueError(f"output shape {list(g.shape)}, the original's {list(w.shape)}")
            diff = float(np.abs(g.astype(np.float64) - w.astype(np.float64)).max()) if w.size else 0.0
            scale = float(np.abs(w.astype(np.float64)).max()) if w.size else 0.0
            worst_abs = max(worst_abs, diff)
            worst_rel = max(worst_rel, diff / scale if scale else (0.0 if diff == 0 else float("inf")))
            ok &= diff <= ATOL + RTOL * scale
    return worst_abs, worst_rel, ok


def evaluate(row: Row, path: Path, entry, reference: list[list[np.ndarray]] | None,
             threads: int) -> list[list[np.ndarray]] | None:
    """Fill ``row``'s node count and difference from ``reference`` (None: torch eager's);
    returns the model's outputs on the entry's feeds (None where it failed)."""
    from simplify_models import first_line

    row.nodes = count_nodes(onnx.load(str(path), load_external_data=False))
    try:
        session = _session(path, optimize=False, threads=threads)
        got = [_outputs(session, f) for f in entry.feeds]
        row.max_abs, row.max_rel, row.matches = _difference(got, reference or entry.expected)
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        row.status = "ort failed"
        row.error = f"ORT: {first_line(exc)}"
        return None
    return got


def measure_entry(entry, tools: dict[str, Tool], out_dir: Path, *, runs: int = 10, threads: int = 1, sessions: int = 1,
                  timeout: float = 600.0, repeat: int = 1, log: Callable[[str], None] = _log) -> list[Row]:
    """The original and every tool on one corpus entry: each tool's run, then every
    output's check against the original, then their latencies, taking turns. ``repeat``
    above 1: every tool runs that many times, the tools taking turns (a different one first
    each round), and its seconds are the median; ``tools["baseline"]`` (graphkit at another
    commit, --baseline-cmd) is measured as a tool of its own, after the others."""
    names = TOOLS + (("baseline",) if "baseline" in tools else ())
    rows = [Row(entry.model, entry.exporter, entry.shapes, name) for name in names]
    if entry.error:
        for row in rows:
            row.status, row.error = "export failed", entry.error
        return rows
    original = rows[0]
    reference = evaluate(original, entry.path, entry, None, threads)
    timed = [(original, entry.path)]
    for row in rows[1:]:
        tool = tools.get(row.tool) or Tool(row.tool, None, "skipped")
        if tool.command is None:
            row.status = "n/a" if row.tool == "graphkit" else "skipped"
            row.error = tool.reason
            continue
        out = out_dir / f"{entry.path.stem}.{row.tool}.onnx"
        log(f"{entry.label}: {row.tool}")
        done = run_process([*tool.command, str(entry.path), str(out)], timeout)
        row.seconds, row.peak_rss_mib = done.seconds, done.peak_rss_mib
        if done.returncode or not out.exists():
            row.status = "failed"
            row.error = (f"exit {done.returncode}: " if done.returncode else "no output: ") + _error_line(done.output)
            continue
        if reference is None:
            row.status, row.error = "not compared", "the original does not run"
            row.nodes = count_nodes(onnx.load(str(out), load_external_data=False))
            continue
        evaluate(row, out, entry, reference, threads)
        timed.append((row, out))
    _repeat_tools(entry, rows, tools, out_dir, repeat, timeout, log)
    if runs:
        log(f"{entry.label}: latency, {runs} runs each")
        # The control: graphkit's output again, in a session of its own, taking its turns
        # with the others. Two sessions of one file differ only by the machine and where
        # ONNX Runtime's buffers land: their ratio is how far apart equal models read.
        gk = next((r for r in rows if r.tool == "graphkit" and r.status == "ok"), None)
        control = Row(entry.model, entry.exporter, entry.shapes, "control")
        if gk is not None:
            timed.append((control, next(path for row, path in timed if row is gk)))
        _latencies(timed, entry.feeds[0], runs, threads, sessions)
        if gk is not None:
            gk.control_cpu_ms = control.cpu_ms
    return rows


def _repeat_tools(entry, rows: list[Row], tools: dict[str, Tool], out_dir: Path, repeat: int, timeout: float,
                  log: Callable[[str], None]) -> None:
    """Each tool that ran once runs ``repeat - 1`` more times, taking turns; its seconds
    become the median of all its runs (a run that fails now counts as the row's failure)."""
    again = [r for r in rows[1:] if r.status == "ok" and r.seconds is not None]
    if repeat <= 1 or not again:
        return
    log(f"{entry.label}: every tool {repeat - 1} more times, taking turns")
    seconds = {r.tool: [r.seconds] for r in again}
    for i in range(repeat - 1):
        for row in again[i % len(again):] + again[:i % len(again)]:
            out = out_dir / f"{entry.path.stem}.{row.tool}.again.onnx"
            done = run_process([*tools[row.tool].command, str(entry.path), str(out)], timeout)
            if done.returncode:
                row.status, row.error = "failed", f"exit {done.returncode} on run {i + 2}: {_error_line(done.output)}"
            seconds[row.tool].append(done.seconds)
            out.unlink(missing_ok=True)
    for row in again:
        row.seconds = statistics.median(seconds[row.tool])


def run_bench(entries: Sequence, tools: dict[str, Tool], out_dir: Path, **kwargs) -> list[Row]:
    rows = []
    for entry in entries:
        rows += measure_entry(entry, tools, out_dir, **kwargs)
    return rows


# --------------------------------------------------------------------------- reporting


@dataclass
class Ratios:
    """graphkit against the contenders on one entry (None: not measurable)."""

    model: str
    exporter: str
    shapes: str
    best_nodes: str | None  # the contender with the fewest nodes (of those that match)
    nodes: float | None  # graphkit nodes / best contender's
    time_vs_onnxslim: float | None
    best_latency: dict[str, str] = field(default_factory=dict)
    latency: dict[str, float | None] = field(default_factory=dict)  # graphkit / best contender's (CPU ms)
    noise: dict[str, float | None] = field(default_factory=dict)  # graphkit's output, second session / first
    baseline_vs_onnxslim: float | None = None  # --baseline-cmd's seconds / onnxslim's, same run


def ratios(rows: Sequence[Row]) -> list[Ratios]:
    out = []
    groups: dict[tuple[str, str, str], dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.exporter, r.shapes), {})[r.tool] = r
    for (model, exporter, shapes), by_tool in groups.items():
        gk = by_tool.get("graphkit")
        gk_ok = gk is not None and gk.status == "ok" and gk.matches
        valid = [by_tool[c] for c in CONTENDERS if c in by_tool and by_tool[c].status == "ok" and by_tool[c].matches]
        best = min(valid, key=lambda r: r.nodes, default=None)
        slim = by_tool.get("onnxslim")
        result = Ratios(model, exporter, shapes, best.tool if best else None,
                        gk.nodes / best.nodes if gk_ok and best and best.nodes else None,
                        gk.seconds / slim.seconds if gk_ok and slim and slim.status == "ok" and slim.seconds
                        else None)
        base = by_tool.get("baseline")
        if base is not None and base.status == "ok" and base.matches and slim and slim.status == "ok" and slim.seconds:
            result.baseline_vs_onnxslim = base.seconds / slim.seconds
        for level in ("disabled", "enabled"):
            timed = [r for r in valid if level in r.cpu_ms]
            fastest = min(timed, key=lambda r: r.cpu_ms[level], default=None)
            result.best_latency[level] = fastest.tool if fastest else None
            result.latency[level] = (gk.cpu_ms[level] / fastest.cpu_ms[level]
                                     if gk_ok and fastest and level in gk.cpu_ms else None)
            result.noise[level] = (gk.control_cpu_ms[level] / gk.cpu_ms[level]
                                   if gk is not None and level in gk.control_cpu_ms and gk.cpu_ms.get(level) else None)
        out.append(result)
    return out


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ms(row: Row, level: str) -> str:
    if level not in row.cpu_ms:
        return "-"
    return f"{row.cpu_ms[level]:.2f} / {row.latency_ms[level]:.2f}"


def format_table(rows: Sequence[Row]) -> str:
    """The markdown table (one row per tool per entry), then the ratios, then the errors."""
    lines = ["| model | exporter | shapes | tool | nodes | tool s | peak MiB | max abs diff | diff / scale "
             "| ORT ms no-opt CPU / wall | ORT ms opt CPU / wall | status |",
             "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    notes: dict[str, int] = {}  # text -> number; a tool absent everywhere is said once, above the table
    for r in rows:
        status = r.status if r.status != "ok" or r.matches is not False else "MISMATCH"
        if r.error and r.status not in ("skipped", "n/a"):
            text = f"export: {r.error}" if r.status == "export failed" else f"{r.tool}: {r.error}"
            text = f"{r.model}/{r.exporter}/{r.shapes} {text}"
            status += f" [{notes.setdefault(text, len(notes) + 1)}]"
        lines.append(f"| {r.model} | {r.exporter} | {r.shapes} | {r.tool} | {_num(r.nodes, 'd')} "
                     f"| {_num(r.seconds, '.2f')} | {_num(r.peak_rss_mib, '.0f')} | {_num(r.max_abs, '.2e')} "
                     f"| {_num(r.max_rel, '.1e')} | {_ms(r, 'disabled')} | {_ms(r, 'enabled')} | {status} |")
    lines += ["", "The original's diff is against torch eager; every tool's against the original in ONNX Runtime "
              "(ORT_DISABLE_ALL, every feed). Latency: median of a run at batch 1, 1 intra-op thread, the models "
              "taking turns; CPU: the running thread's CPU time (the ratios use it), wall: elapsed. Peak RSS "
              "counts ~10 MiB of the launcher the tool is forked from. Same model twice: graphkit's output in a "
              "second session, timed in the same turns, over the first (what equal models differ by here).", "",
              "| model | exporter | shapes | graphkit nodes / best contender | graphkit s / onnxslim s "
              "| graphkit CPU ms / best (no-opt) | graphkit CPU ms / best (opt) | same model twice (no-opt; opt) |",
              "|---|---|---|--:|--:|--:|--:|--:|"]
    table = ratios(rows)
    baseline = any(r.tool == "baseline" for r in rows)
    if baseline:  # (a column more: the baseline's seconds over onnxslim's, in the same run)
        lines[-2] = lines[-2].replace("| graphkit s / onnxslim s ", "| graphkit s / onnxslim s | baseline s / onnxslim s ")
        lines[-1] = lines[-1] + "--:|"
    for q in table:
        def cell(value: float | None, who: str | None) -> str:
            return "n/a" if value is None else f"{value:.2f}" + (f" ({who})" if who else "")

        lines.append(f"| {q.model} | {q.exporter} | {q.shapes} | {cell(q.nodes, q.best_nodes)} "
                     f"| {cell(q.time_vs_onnxslim, None)} "
                     + (f"| {cell(q.baseline_vs_onnxslim, None)} " if baseline else "") +
                     f"| {cell(q.latency['disabled'], q.best_latency['disabled'])} "
                     f"| {cell(q.latency['enabled'], q.best_latency['enabled'])} "
                     f"| {cell(q.noise['disabled'], None)}; {cell(q.noise['enabled'], None)} |")
    if notes:
        lines += ["", "Notes:", *[f"{i}. {text}" for text, i in notes.items()]]
    return "\n".join(lines)


def to_json(rows: Sequence[Row], meta: dict, entries: Sequence = ()) -> dict:
    corpus = [{"model": e.model, "exporter": e.exporter, "shapes": e.shapes, "path": str(e.path),
               "feed_shapes": [{k: list(v.shape) for k, v in f.items()} for f in e.feeds],
               "export_seconds": e.export_seconds, "error": e.error} for e in entries]
    return {"meta": meta, "corpus": corpus, "rows": [asdict(r) for r in rows],
            "ratios": [asdict(q) for q in ratios(rows)]}


# --------------------------------------------------------------------------- main


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; choose from {', '.join(known)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    import simplify_models as sm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=lambda s: _names(s, list(sm.MODELS), "model"), default=list(sm.MODELS),
                        help=f"comma-separated (default all: {','.join(sm.MODELS)})")
    parser.add_argument("--exporters", type=lambda s: _names(s, sm.EXPORTERS, "exporter"),
                        default=list(sm.EXPORTERS))
    parser.add_argument("--shapes", type=lambda s: _names(s, sm.SHAPES, "shape mode"), default=list(sm.SHAPES))
    parser.add_argument("--small", action="store_true", help="the test suite's tiny configs (32x32 images)")
    parser.add_argument("--runs", type=int, default=None, help="timed ORT runs per latency (default 10; 30 --small)")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    parser.add_argument("--sessions", type=int, default=1,
                        help="ORT sessions per model, each timed --runs times (default 1; the median is over all)")
    parser.add_argument("--graphkit-cmd", default=None, help='the graphkit command (default: this venv\'s "graphkit")')
    parser.add_argument("--baseline-cmd", default=None,
                        help="another graphkit command, timed as the tool 'baseline' in the same run (for example "
                             "graphkit at an earlier commit: \"env PYTHONPATH=/tmp/old python -m graphkit\")")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every tool this many times, taking turns; its seconds are the median (default 1)")
    parser.add_argument("--contenders", type=lambda s: _names(s, CONTENDERS, "contender"), default=list(CONTENDERS))
    parser.add_argument("--no-install", action="store_true", help="do not create the contenders' venv")
    parser.add_argument("--venv", type=Path, default=VENV, help="the contenders' venv")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per tool run")
    parser.add_argument("--keep", type=Path, default=None, help="write the models and outputs here")
    parser.add_argument("--json", default=None, help="write the results as JSON to this file ('-': stdout)")
    args = parser.parse_args(argv)
    runs = args.runs if args.runs is not None else (30 if args.small else 10)

    import onnxruntime
    import torch

    contenders = ensure_contenders(args.venv, install=not args.no_install)
    tools = {"graphkit": graphkit_tool(shlex.split(args.graphkit_cmd) if args.graphkit_cmd else None),
             **{c: contenders[c] for c in args.contenders}}
    if args.baseline_cmd:
        tools["baseline"] = Tool("baseline", graphkit_tool(shlex.split(args.baseline_cmd)).command)
    meta = {"small": args.small, "runs": runs, "sessions": args.sessions, "threads": args.threads, "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "contenders": contender_versions(args.venv),
            "tools": {k: (" ".join(t.command) if t.command else t.reason) for k, t in tools.items()},
            "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="simplify-bench-") as tmp:
        folder = args.keep or Path(tmp)
        entries = sm.build_corpus(folder, small=args.small, models=args.models, exporters=args.exporters,
                                  shapes=args.shapes, log=_log)
        rows = run_bench(entries, tools, folder, runs=runs, threads=args.threads, sessions=args.sessions,
                         timeout=args.timeout, repeat=args.repeat)
    meta["load_average_end"] = os.getloadavg()
    versions = ", ".join(f"{k} {v}" for k, v in meta["contenders"].items())
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__} (graphkit's); contenders' venv: "
          f"{versions or 'none'}; {'small' if args.small else 'full'} models; {runs} timed runs"
          f"{f' of each of {args.sessions} sessions' if args.sessions > 1 else ''}; "
          f"load average {meta['load_average'][0]:.1f} -> {meta['load_average_end'][0]:.1f}")
    for name, tool in tools.items():
        if tool.command is None:
            print(f"{name}: {tool.reason}")
    print()
    print(format_table(rows))
    if args.json:
        text = json.dumps(to_json(rows, meta, entries), indent=1, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
