"""A short run of the fuzzer (bench/fuzz.py): mutated models through every entry point
(`graphkit rewrite` with every --bind and --rules, `inspect`, `run`, `compare`, and the
Python API rewrite_model + open_session + run in-process) give only graphkit's documented
errors, one stderr line, no traceback, no partial output, never exit 70 and never a dead
process. bench/fuzz.py's KNOWN list is empty: any crash class fails.

A larger budget: `python bench/fuzz.py --cases 10000`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO

FUZZ = REPO / "bench" / "fuzz.py"


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("graphkit_bench_fuzz", FUZZ)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fuzz_300_cases_in_worker_processes():
    """The real driver: worker processes under RLIMIT_AS, a dead or hung case is recorded."""
    proc = subprocess.run([sys.executable, str(FUZZ), "--cases", "300", "--seed", "20260101", "--jobs", "2",
                           "--json", "--max-seconds", "90"], capture_output=True, text=True, timeout=150)
    summary = json.loads(proc.stdout)
    assert summary["cases"] == 300, summary
    new = [f for f in summary["findings"] if not f["known"]]
    assert not new, json.dumps(new, indent=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rewrite = summary["exit_codes"]["rewrite"]
    assert {"0", "3", "8"} <= set(rewrite), rewrite  # the mutations reach past the parser
    assert FUZZ_MODULE.KNOWN == {}
    for cmd in ("rewrite", "inspect", "run", "compare", "api"):
        codes = summary["exit_codes"][cmd]
        assert "0" in codes, (cmd, codes)  # each entry point is reached with models that work
        assert "70" not in codes and not any(int(c) < 0 for c in codes), (cmd, codes)


FUZZ_MODULE = _fuzz_module()
SEEDS = FUZZ_MODULE.seed_models()


@settings(max_examples=120, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_fuzz_in_process_with_hypothesis(rng):
    """The same mutations drawn by hypothesis, run in this process (it shrinks a failure)."""
    case = FUZZ_MODULE.build_case(rng, SEEDS)
    with tempfile.TemporaryDirectory() as d:
        result = FUZZ_MODULE.run_built_case(case, 0, Path(d))
    for r in result["results"]:
        if r["problem"] is None:
            continue
        assert False, (r, case[3])
