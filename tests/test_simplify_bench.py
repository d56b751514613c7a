"""bench/simplify.py's table on one small model without the contenders, and the simplify
corpus (tests/simplify_models.py): every model exports and its ONNX matches torch eager in
ONNX Runtime.

The corpus test runs every model with the TorchScript exporter (static and dynamic) and
with the dynamo exporter dynamic; ``GRAPHKIT_SIMPLIFY_CORPUS=1`` adds the dynamo static
exports (the heavy ones: another dynamo trace per model).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")

import simplify_models as sm  # noqa: E402
from conftest import REPO  # noqa: E402

from graphkit.runtime import open_session  # noqa: E402

FULL = os.environ.get("GRAPHKIT_SIMPLIFY_CORPUS") == "1"
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")


def _load_bench():
    spec = importlib.util.spec_from_file_location("simplify_bench", REPO / "bench" / "simplify.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# A stand-in for `graphkit simplify IN OUT` that copies the model: the table's plumbing is
# tested without depending on the simplifier itself.
COPY_TOOL = (sys.executable, "-c",
             "import shutil, sys\n"
             "if sys.argv[1:3] != ['simplify', '--help']: shutil.copy(sys.argv[2], sys.argv[3])")


def test_table_without_contenders(tmp_path):
    bench = _load_bench()
    contenders = bench.ensure_contenders(tmp_path / "absent-venv", install=False)
    assert set(contenders) == set(bench.CONTENDERS)
    assert all(t.command is None for t in contenders.values())
    assert bench.graphkit_tool([sys.executable, "-c", "import sys; sys.exit('invalid choice')"]).command is None

    entry = sm.export_entry(sm.resnet50(small=True), "torchscript", True, tmp_path)
    assert entry.error is None, entry.error
    tools = {"graphkit": bench.graphkit_tool(COPY_TOOL), **contenders}
    rows = bench.run_bench([entry], tools, tmp_path, runs=2, timeout=60, log=lambda _: None)

    by_tool = {r.tool: r for r in rows}
    assert list(by_tool) == list(bench.TOOLS)
    original, copy = by_tool["original"], by_tool["graphkit"]
    assert original.status == "ok" and original.matches, original.error  # vs torch eager
    assert copy.status == "ok" and copy.nodes == original.nodes and copy.max_abs == 0.0
    assert copy.seconds > 0 and copy.peak_rss_mib > 0
    assert set(copy.latency_ms) == set(copy.cpu_ms) == {"disabled", "enabled"}
    assert all(by_tool[c].status == "skipped" for c in bench.CONTENDERS)

    table = bench.format_table(rows)
    assert f"| resnet50 | torchscript | dynamic | graphkit | {original.nodes} |" in table
    assert "| resnet50 | torchscript | dynamic | n/a | n/a | n/a | n/a |" in table  # no contender to compare
    data = json.loads(json.dumps(bench.to_json(rows, {"small": True}, [entry])))
    assert [r["tool"] for r in data["rows"]] == list(bench.TOOLS)
    assert [c["shapes"] for c in data["corpus"]] == ["dynamic"] and len(data["corpus"][0]["feed_shapes"]) == 2


@functools.cache
def _model(name: str) -> sm.Model:
    return sm.MODELS[name](True)


CORPUS = [pytest.param(m, e, s, id=f"{m}-{e}-{s}",
                       marks=[] if FULL or (e, s) != ("dynamo", "static") else
                       [pytest.mark.skip(reason="heavy: GRAPHKIT_SIMPLIFY_CORPUS=1")])
          for m in sm.MODELS for e in sm.EXPORTERS for s in sm.SHAPES]


@pytest.mark.parametrize("name,exporter,shapes", CORPUS)
def test_corpus_matches_torch_and_simplifies_to_the_same_values(tmp_path, name, exporter, shapes):
    """Each corpus model, exported, matches torch eager; `graphkit simplify`'s output has no
    more nodes and gives ONNX Runtime's outputs of the export within 1e-5 of their scale, at
    both feed shapes of a dynamic model."""
    entry = sm.export_entry(_model(name), exporter, shapes == "dynamic", tmp_path)
    assert entry.error is None, entry.error
    assert len(entry.feeds) == (2 if entry.dynamic else 1)
    if entry.dynamic:  # two shapes: the differential checks see a dimension change
        first, second = ({k: v.shape for k, v in f.items()} for f in entry.feeds)
        assert first != second
    session = open_session(entry.path)
    from graphkit.rewrite.simplify import simplify_file

    small = tmp_path / "simplified.onnx"
    result = simplify_file(entry.path, small)
    assert sum(result.report.ops_after.values()) <= sum(result.report.ops_before.values())
    simplified = open_session(small)
    for feeds, want in zip(entry.feeds, entry.expected):
        got = list(session.run(feeds).values())
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=entry.atol, rtol=entry.rtol)
        for g, s in zip(got, simplified.run(feeds).values()):
            scale = max(float(np.max(np.abs(g))), 1e-30)
            assert float(np.max(np.abs(s.astype(np.float64) - g))) <= 1e-5 * scale
