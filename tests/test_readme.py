"""Every code block of the README runs as written, in order, in one folder: a reader's session.

- ```sh blocks: each line runs in bash (``graphkit`` is the installed command, ``python`` this
  interpreter); ``# ...`` comments are the reader's notes. The first block's ``make demo`` /
  ``make test`` are what CI itself runs (`.ci/run`), and test_samples_run_all_matches_torch runs
  the demo's script: they are checked to be there, not re-run.
- ```python blocks run as scripts; ```python file=NAME writes the block to NAME (a model or
  rules file the next commands use).
- other blocks (```text, tables of output) are not code.
The folder holds links to samples/ and docs/, as in a checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import REPO

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
ONLY_CHECKED = ("make demo", "make test")


def blocks(path: Path) -> list[tuple[str, dict, str, int]]:
    """(language, options, body, line) of each fenced block."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        lang, *opts = m.group(1).split()
        options = dict(o.split("=", 1) for o in opts if "=" in o)
        out.append((lang, options, m.group(2), text[:m.start()].count("\n") + 1))
    return out


def _commands(body: str) -> list[str]:
    lines = []
    for line in body.splitlines():
        command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        if command and not command.startswith("#"):
            lines.append(command)
    return lines


def test_readme_blocks_are_all_runnable_kinds():
    kinds = {(lang, tuple(sorted(opts))) for lang, opts, _, _ in blocks(REPO / "README.md")}
    assert kinds <= {("sh", ()), ("python", ()), ("python", ("file",)), ("text", ())}, kinds


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """Run the README top to bottom; return the folder and each command's output."""
    work = tmp_path_factory.mktemp("reader")
    for name in ("samples", "docs"):
        (work / name).symlink_to(REPO / name)
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    outputs: list[tuple[int, str, str]] = []
    first = True
    for lang, options, body, line in blocks(REPO / "README.md"):
        if lang == "python" and "file" in options:
            (work / options["file"]).write_text(body)
        elif lang == "python":
            script = work / f"readme_block_{line}.py"
            script.write_text(body)
            proc = subprocess.run([sys.executable, script.name], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"README.md:{line}: python block failed\n{proc.stdout}\n{proc.stderr}"
            outputs.append((line, "python", proc.stdout))
        elif lang == "sh":
            commands = _commands(body)
            if first:
                assert commands == list(ONLY_CHECKED), commands
                first = False
                continue
            for command in commands:
                if not shutil.which("dot") and ("--diff" in command or command.startswith("graphkit show")):
                    if os.environ.get("GRAPHKIT_REQUIRE_TOOLS") == "1":
                        pytest.fail("graphviz's dot is not installed (the Makefile's sysdeps target installs it)")
                    command = re.sub(r"\s--diff\s+\S+", "", command)  # pictures need graphviz
                    if command.startswith("graphkit show"):
                        continue
                proc = subprocess.run(["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)
                                       if command.startswith("python ") else command],
                                      cwd=work, env=env, capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, \
                    f"README.md:{line}: `{command}` exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
                outputs.append((line, command, proc.stdout))
    return work, outputs


def _output(outputs, prefix: str) -> str:
    return "\n".join(out for _, command, out in outputs if command.startswith(prefix))


def test_readme_runs_as_written(session):
    work, outputs = session
    assert len(outputs) >= 20
    # the reader's first model went the whole way: exported, inspected, lowered three ways, run
    assert "custom::my_add x1" in _output(outputs, "graphkit inspect model.onnx")
    assert "rule fuse_my_add: applied 1x" in _output(outputs, "graphkit rewrite model.std.onnx fused.onnx")
    fused = onnx.load(work / "fused.onnx")
    assert [(n.domain, n.op_type) for n in fused.graph.node if n.op_type != "Constant"] == \
        [("custom", "my_add"), ("", "Relu")]
    y = np.load(work / "y.npz")
    assert len(y.files) == 1
    # and a picture of what the rewrite changed
    index = (work / "pictures" / "index.html")
    if shutil.which("dot"):
        assert "custom::my_add" in index.read_text()


def test_readme_python_blocks_print_what_they_say(session):
    _, outputs = session
    python_out = "\n".join(out for _, kind, out in outputs if kind == "python")
    assert "rule fuse_my_add: applied 1x" in python_out
    # every `# prints:` line of a block is a line of that block's output, in order
    by_line = {line: out.splitlines() for line, kind, out in outputs if kind == "python"}
    checked = 0
    for lang, options, body, line in blocks(REPO / "README.md"):
        want = [ln.split("# prints: ", 1)[1] for ln in body.splitlines() if "# prints: " in ln]
        if lang != "python" or "file" in options or not want:
            continue
        got = iter(by_line[line])
        missing = [w for w in want if not any(g == w for g in got)]
        assert not missing, f"README.md:{line}: does not print {missing[0]!r}; it printed {by_line[line]}"
        checked += 1
    assert checked >= 6


def test_readme_rule_patterns_print_what_they_say(session):
    """Each example of the rule-pattern section prints exactly its `# prints:` lines, and every
    feature of the section's table is used by one of them."""
    _, outputs = session
    by_line = {line: out for line, kind, out in outputs if kind == "python"}
    text = (REPO / "README.md").read_text()
    start = text.index("### Rule patterns")
    end = text.index("\n## ", start)
    checked = 0
    code = ""
    for lang, options, body, line in blocks(REPO / "README.md"):
        offset = len("\n".join(text.splitlines()[:line - 1]))
        if lang != "python" or not start <= offset < end:
            continue
        code += body
        want = [ln.split("# prints: ", 1)[1] for ln in body.splitlines() if ln.startswith("# prints: ")]
        if "file" in options:
            continue
        assert want, f"README.md:{line}: a rule example without `# prints:` lines"
        assert by_line[line].splitlines() == want, f"README.md:{line}"
        checked += 1
    assert checked == 6
    for feature in ("const(", "either(", "optional(", "_outputs=2)[0]", "*xs", "return op.Slice(x", "d = op.Sub",
                    "axes=axes", "ctx.shape(", "ctx.rank(", "op.initializer(", "GraphPass(", "lambda op, x: x",
                    "perm=(1, 0)", "explain()", "RuleError", "max_rounds", "main_only=True", "scope.add_input(",
                    "scope.remove_input(", "scope.add_output(", "scope.remove_output(", "scope.rename(",
                    "scope.prune()"):
        assert feature in code, feature
