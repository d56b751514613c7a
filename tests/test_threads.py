"""The public API from several threads at once (issue 17): rewrite_model with every binding,
open_session + run, and onnx schema registration shared between threads.

Before: rewrite_model from 8 threads crashed the process (SIGSEGV/SIGFPE) or raised
"my_add ... already registered", because op schemas were added to and removed from onnx's
process-wide table with no lock or count while other threads ran the checker and shape
inference. The stress test compares every thread's results with a single-threaded run.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphkit.errors import OpDefinitionError
from graphkit.ops import OpRegistry, Param, default_registry
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.runtime.session import open_session

THREADS = 8
LOWERINGS = (Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON)


def _model(i: int, domain: str = "custom") -> onnx.ModelProto:
    """A chain of 1..4 my_add nodes (some with asinh) over an initializer unique to ``i``."""
    rs = np.random.default_rng(i)
    w = numpy_helper.from_array(rs.standard_normal((2, 3)).astype(np.float32), "w")
    nodes, prev = [], "a"
    for k in range(1 + i % 4):
        nodes.append(helper.make_node("my_add", [prev, "w"], [f"y{k}"], domain=domain, name=f"add{k}"))
        prev = f"y{k}"
    if i % 3 == 0 and domain == "custom":
        nodes.append(helper.make_node("asinh", [prev], ["s"], domain="custom", name="asinh0"))
        prev = "s"
    nodes.append(helper.make_node("Relu", [prev], ["z"], name="relu"))
    graph = helper.make_graph(nodes, f"g{i}", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
                             ir_version=10)


def _feeds(i: int) -> dict:
    return {"a": np.random.default_rng(1000 + i).standard_normal((2, 3)).astype(np.float32)}


def _job(model: onnx.ModelProto, i: int, lowering: Lowering, registry: OpRegistry | None = None):
    out, _ = rewrite_model(model, lowering=(lowering, Lowering.DECOMPOSE), registry=registry)
    session = open_session(out, registry=registry)
    result = session.run(_feeds(i))
    return out.SerializeToString(), {k: v.copy() for k, v in result.items()}


def _assert_same(got, want, what):
    assert got[0] == want[0], f"{what}: the rewritten model differs from the single-threaded one"
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        np.testing.assert_array_equal(got[1][k], want[1][k], err_msg=what)


@pytest.fixture
def busy_switching():
    """Switch threads every 10 us (default 5 ms): a race window that is there is hit."""
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def test_rewrite_and_run_from_8_threads_match_a_single_thread(busy_switching):
    models = [_model(i) for i in range(16)]
    tasks = [(i, lowering) for i in range(len(models)) for lowering in LOWERINGS]
    want = {t: _job(models[t[0]], *t) for t in tasks}  # single-threaded (also builds the kernels)

    rounds = 2
    start = threading.Barrier(THREADS)

    def worker(w: int):
        order = [t for _ in range(rounds) for t in tasks]
        random.Random(w).shuffle(order)
        start.wait()
        return [(t, _job(models[t[0]], *t)) for t in order]

    t0 = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        done = list(pool.map(worker, range(THREADS)))
    runs = 0
    for results in done:
        for t, got in results:
            _assert_same(got, want[t], f"model {t[0]} bound {t[1].value}")
            runs += 1
    assert runs == THREADS * rounds * len(tasks)
    assert time.monotonic() - t0 < 60
    # nothing of graphkit's is left in onnx's table once every thread is done
    assert not onnx.defs.has("my_add", 1, "custom")


def _renamed_registry(k: int) -> OpRegistry:
    """my_add in a domain of its own: a schema that has to be written while others read."""
    op = dataclasses.replace(default_registry().get("custom::my_add"), domain=f"acme{k}", native=False)
    return OpRegistry([op])


def test_registries_with_their_own_schemas_from_threads(busy_switching):
    """Each thread brings schemas no one else has (writes while other threads read onnx's
    table), and other threads use graphkit's default ones at the same time."""
    jobs = []
    for i in range(48):
        k = i % 6
        if i % 2:
            jobs.append((_model(i, f"acme{k}"), i, Lowering.DECOMPOSE if i % 4 == 1 else Lowering.PYTHON, k))
        else:
            jobs.append((_model(i), i, LOWERINGS[i % 3], None))

    def run(job):
        model, i, lowering, k = job
        return _job(model, i, lowering, None if k is None else _renamed_registry(k))

    want = [run(j) for j in jobs]
    with ThreadPoolExecutor(THREADS) as pool:
        for _ in range(2):
            got = list(pool.map(run, jobs))
            for g, w, j in zip(got, want, jobs):
                _assert_same(g, w, f"model {j[1]}")
    for k in range(6):
        assert not onnx.defs.has("my_add", 1, f"acme{k}")


def test_nested_blocks_with_new_schemas_on_two_threads_do_not_deadlock():
    """Two threads inside a block each enter a block that needs a new schema."""
    base = default_registry()
    inside = threading.Barrier(2)
    errors = []

    def worker(k):
        try:
            with base.onnx_schemas():
                inside.wait(timeout=10)
                with _renamed_registry(100 + k).onnx_schemas():
                    assert onnx.defs.has("my_add", 1, f"acme{100 + k}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    assert not onnx.defs.has("my_add", 1, "acme100")


def test_one_schema_two_signatures_at_once_is_a_clear_error():
    op = default_registry().get("custom::my_add")
    other = dataclasses.replace(op, domain="clash", native=False,
                                inputs=(*op.inputs, Param("c", op.inputs[0].type, "third")))
    a, b = OpRegistry([dataclasses.replace(op, domain="clash", native=False)]), OpRegistry([other])
    entered, leave = threading.Event(), threading.Event()

    def holder():
        with a.onnx_schemas():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert entered.wait(10)
        with pytest.raises(OpDefinitionError, match=r"clash::my_add .*another definition"):
            with b.onnx_schemas():
                pass
        # the schema in use is untouched
        assert len(onnx.defs.get_schema("my_add", 1, "clash").inputs) == 2
    finally:
        leave.set()
        t.join()
    # once nobody uses the first one, the other definition may take its place
    with b.onnx_schemas():
        assert len(onnx.defs.get_schema("my_add", 1, "clash").inputs) == 3
    assert not onnx.defs.has("my_add", 1, "clash")


def test_an_identical_schema_is_shared_and_removed_with_its_last_user():
    reg = default_registry()
    entered, leave = threading.Event(), threading.Event()

    def holder():
        with reg.onnx_schemas():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert entered.wait(10)
    with OpRegistry(list(reg)).onnx_schemas():  # same ops through another registry object
        assert onnx.defs.has("my_add", 1, "custom")
    assert onnx.defs.has("my_add", 1, "custom"), "removed while another thread still uses it"
    leave.set()
    t.join()
    assert not onnx.defs.has("my_add", 1, "custom")


def test_exports_from_threads_are_serialized(tmp_path, monkeypatch):
    """Two threads exporting at once: both models come out whole (one export at a time)."""
    torch = pytest.importorskip("torch")
    import onnx

    from graphkit.export import export
    from graphkit.export import _export as export_module

    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    inside, most = [0], [0]
    original = export_module._export

    def counting(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        try:
            return original(*args, **kwargs)
        finally:
            inside[0] -= 1

    errors = []

    def work(k):
        try:
            export(Net(), (torch.ones(2, 3),), tmp_path / f"m{k}.onnx", dynamo=False)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    monkeypatch.setattr(export_module, "_export", counting)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and most[0] == 1
    for k in range(3):
        onnx.checker.check_model(onnx.load(tmp_path / f"m{k}.onnx"))
