"""Every code block of the README and of the pages a reader goes on to (doc_pages.READER_PAGES:
docs/pictures.md, rules.md, export.md, rewrite.md, op-packages.md) runs as written, in order,
in one folder: a reader's session. The pages after the README may use what its tour made.

- ```sh blocks: each line runs in bash (``graphkit`` is the installed command, ``python`` this
  interpreter); ``# ...`` comments are the reader's notes. The README's first block's
  ``make demo`` / ``make test`` are what CI itself runs (`.ci/run`), and
  test_samples_run_all_matches_torch runs the demo's script: they are checked to be there, not
  re-run.
- ```python blocks run as scripts; ```python file=NAME writes the block to NAME (a model or
  rules file the next commands use).
- other blocks (```text, tables of output) are not code.
The folder holds links to samples/ and docs/, as in a checkout.

The other docs pages are run by tests/test_docs_pages.py, or by a walk-through test of their
own (docs/writing-ops.md, docs/deploy.md); test_every_page_has_one_runner checks that.
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
from doc_pages import DOCS, README, READER_PAGES, anchors, blocks, name, relative_links, section, \
    standalone_pages, walk_through_tests

ONLY_CHECKED = ("make demo", "make test")
README_MAX_LINES = 250  # a front door: what it is, install, the two commands, a tour, links


def _commands(body: str) -> list[str]:
    lines = []
    for line in body.splitlines():
        command = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
        if command and not command.startswith("#"):
            lines.append(command)
    return lines


@pytest.mark.parametrize("page", READER_PAGES, ids=name)
def test_reader_page_blocks_are_all_runnable_kinds(page):
    kinds = {(lang, tuple(sorted(opts))) for lang, opts, _, _ in blocks(page)}
    assert kinds <= {("sh", ()), ("python", ()), ("python", ("file",)), ("text", ())}, (name(page), kinds)


def test_every_page_has_one_runner():
    """Each docs page is run by exactly one of: the reader's session (this file), a walk-through
    test of its own, tests/test_docs_pages.py."""
    walked = walk_through_tests()
    standalone = standalone_pages()
    for page in sorted(DOCS.glob("*.md")):
        runners = [page in READER_PAGES, page.name in walked, page in standalone]
        assert runners.count(True) == 1, (name(page), runners)
        assert len(walked.get(page.name, [])) <= 1, (name(page), walked[page.name])
    for page in READER_PAGES:
        assert page.exists(), name(page)


def test_readme_is_a_front_door():
    """At most README_MAX_LINES lines; the two commands first; every relative link is a page
    under docs/ (or a file of the checkout), and every #anchor a heading of its page."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, len(text.splitlines())
    links = relative_links(README)
    linked_pages = set()
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for link in relative_links(page):
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            assert target.exists(), f"{name(page)}: link {link!r}: no {target}"
            if anchor and target.suffix == ".md":
                assert anchor in anchors(target), f"{name(page)}: link {link!r}: no such heading"
            if page == README and path:
                assert path.startswith("docs/") and path.endswith(".md"), link
                linked_pages.add(target)
    assert links
    # the README links every page but the site's home (docs/index.md lists the same pages)
    assert linked_pages == set(DOCS.glob("*.md")) - {DOCS / "index.md"}, \
        sorted(map(name, set(DOCS.glob("*.md")) - {DOCS / "index.md"} - linked_pages))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """Run the README top to bottom, then each reader page; return the folder and each
    command's output as (page, line, command or "python", stdout)."""
    work = tmp_path_factory.mktemp("reader")
    for folder in ("samples", "docs"):
        (work / folder).symlink_to(REPO / folder)
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    outputs: list[tuple[Path, int, str, str]] = []
    first = True
    for page in READER_PAGES:
        for lang, options, body, line in blocks(page):
            where = f"{name(page)}:{line}"
            if lang == "python" and "file" in options:
                (work / options["file"]).write_text(body)
            elif lang == "python":
                script = work / f"{page.stem}_block_{line}.py"
                script.write_text(body)
                proc = subprocess.run([sys.executable, script.name], cwd=work, env=env,
                                      capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, f"{where}: python block failed\n{proc.stdout}\n{proc.stderr}"
                outputs.append((page, line, "python", proc.stdout))
            elif lang == "sh":
                commands = _commands(body)
                if first:
                    assert page == README and commands == list(ONLY_CHECKED), (where, commands)
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
                        f"{where}: `{command}` exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
                    outputs.append((page, line, command, proc.stdout))
    return work, outputs


def _output(outputs, prefix: str) -> str:
    return "\n".join(out for _, _, command, out in outputs if command.startswith(prefix))


def test_readme_runs_as_written(session):
    work, outputs = session
    assert len(outputs) >= 20
    assert len([o for o in outputs if o[0] == README]) >= 10  # the tour: its commands and its Python
    for page in READER_PAGES[1:]:
        assert any(o[0] == page for o in outputs), f"{name(page)} ran nothing"
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
    python_out = "\n".join(out for _, _, kind, out in outputs if kind == "python")
    assert "rule fuse_my_add: applied 1x" in python_out  # docs/rules.md's node substitution
    # every `# prints:` line of a block is a line of that block's output, in order
    by_line = {(page, line): out.splitlines() for page, line, kind, out in outputs if kind == "python"}
    checked = 0
    for page in READER_PAGES:
        for lang, options, body, line in blocks(page):
            want = [ln.split("# prints: ", 1)[1] for ln in body.splitlines() if "# prints: " in ln]
            if lang != "python" or "file" in options or not want:
                continue
            got = iter(by_line[page, line])
            missing = [w for w in want if not any(g == w for g in got)]
            assert not missing, \
                f"{name(page)}:{line}: does not print {missing[0]!r}; it printed {by_line[page, line]}"
            checked += 1
    assert checked >= 7


def test_readme_rule_patterns_print_what_they_say(session):
    """Each example of docs/rules.md's "Rule patterns" section prints exactly its `# prints:`
    lines, and every feature of the section's table is used by one of them."""
    _, outputs = session
    page = DOCS / "rules.md"
    by_line = {line: out for p, line, kind, out in outputs if kind == "python" and p == page}
    text = page.read_text()
    body_of_section = section(page, "## Rule patterns")
    start = text.index(body_of_section)
    end = start + len(body_of_section)
    checked = 0
    code = ""
    for lang, options, body, line in blocks(page):
        offset = len("\n".join(text.splitlines()[:line - 1]))
        if lang != "python" or not start <= offset < end:
            continue
        code += body
        want = [ln.split("# prints: ", 1)[1] for ln in body.splitlines() if ln.startswith("# prints: ")]
        if "file" in options:
            continue
        assert want, f"docs/rules.md:{line}: a rule example without `# prints:` lines"
        assert by_line[line].splitlines() == want, f"docs/rules.md:{line}"
        checked += 1
    assert checked == 6
    for feature in ("const(", "either(", "optional(", "_outputs=2)[0]", "*xs", "return op.Slice(x", "d = op.Sub",
                    "axes=axes", "ctx.shape(", "ctx.rank(", "op.initializer(", "GraphPass(", "lambda op, x: x",
                    "perm=(1, 0)", "explain()", "RuleError", "max_rounds", "main_only=True", "scope.add_input(",
                    "scope.remove_input(", "scope.add_output(", "scope.remove_output(", "scope.rename(",
                    "scope.prune()"):
        assert feature in code, feature
