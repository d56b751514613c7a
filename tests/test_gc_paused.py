"""gc_paused: the one "cyclic collector off" block both writers run their passes in."""

from __future__ import annotations

import gc

import pytest
from onnx import TensorProto, helper

from graphkit.ops import Decomposition, OpDef, OpRegistry, Param
from graphkit.rewrite import rewrite_model
from graphkit.rewrite.bytes import main_graph
from graphkit.rewrite.writers import Request
from graphkit.rewrite._gcpause import gc_paused
from graphkit.rewrite.engine import DEFAULT_PREFERENCE


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_off_inside_restored_after_even_on_error(collector_on):
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), gc_paused():
        1 / 0
    assert gc.isenabled()


def test_nested_and_caller_disabled_stay_off(collector_on):
    with gc_paused():
        with gc_paused():
            pass
        assert not gc.isenabled()  # the inner block does not turn it back on
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # the caller's own disable is kept
    finally:
        gc.enable()


def _recording_registry(seen: list[bool]) -> OpRegistry:
    def twice(b, inputs, attrs):
        seen.append(gc.isenabled())
        return [b.Add(inputs[0], inputs[0])]

    op = OpDef(name="twice", doc="x + x", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),), reference=None,
               infer_shapes=lambda shapes, attrs: [shapes[0]], type_constraints={"T": ("tensor(float)",)},
               decompositions=(Decomposition("add", twice, min_opset=7),))
    return OpRegistry([op])


def _model():
    graph = helper.make_graph([helper.make_node("twice", ["x"], ["y"], domain="custom", name="t0")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def test_both_writers_lower_with_the_collector_off_and_restore_it(collector_on):
    seen: list[bool] = []
    registry = _recording_registry(seen)
    model = _model()
    rewrite_model(model, registry=registry)
    assert seen and not any(seen) and gc.isenabled()
    del seen[:]
    _, report = main_graph.write(Request(model.SerializeToString(), model, registry=registry, prefer=DEFAULT_PREFERENCE))
    assert report.writer == "bytes"
    assert seen and not any(seen) and gc.isenabled()


def _bodies_model(n: int):
    """``n`` If nodes, each branch one placeholder (the bodies writer's shape)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import scaling_models

    return scaling_models.if_bodies(n)


@pytest.mark.parametrize("bodies", [False, True])
def test_the_collectors_first_pass_after_a_rewrite_finds_its_lists_freed(collector_on, bodies):
    # Objects made while the collector is paused are all young when it runs again: were the
    # rewrite's lists still alive then (the check holds them), its first pass would walk them all.
    from graphkit.ops import default_registry
    from graphkit.rewrite.bytes import bodies
    from scaling_models import chain

    n = 3000
    model = _bodies_model(n) if bodies else chain(n)
    write = bodies.write if bodies else main_graph.write
    young: list[int] = []

    def seen(phase, info):
        if phase == "start":
            young.append(len(gc.get_objects(generation=0)))

    write(Request(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE))  # caches made
    gc.collect()
    gc.callbacks.append(seen)
    try:
        _, report = write(Request(model.SerializeToString(), model, registry=default_registry(),
                                  prefer=DEFAULT_PREFERENCE))
    finally:
        gc.callbacks.remove(seen)
    assert report.writer == "bytes"
    assert max(young, default=0) < n // 2, young
