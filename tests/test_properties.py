"""Property tests: every op of graphkit.ops.default_registry() computes the same thing in
every form graphkit ships — each decomposition (at an opset that picks it), the native
kernel, the Python kernel — and that thing is the op's torch reference.

Nothing here knows an op. Inputs come from the definition alone:

* dtypes from the type constraints;
* attributes from their types and defaults (the default, or a value next to it);
* which optional inputs are given;
* shapes by a small constraint search against the op's own ``infer_shapes``: ranks and
  dims are fixed one at a time (small values first), each accepted only if
  ``infer_shapes`` still accepts the partial shapes (unknown dims are None).

An op whose inputs cannot be generated that way is skipped, naming the op. Runs through
graphkit.rewrite.rewrite_model + graphkit.runtime.open_session; hypothesis is
derandomized so the suite is repeatable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from onnx import helper

from graphkit.ops import AttrType, OpDef, discover
from graphkit.ops._opdef import REQUIRED
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.runtime import open_session

MAX_RANK = 4
SMALL = [1, 2, 3, 4, 5]          # tried first, shuffled
LARGER = list(range(6, 65))      # then in order: derived dims (2 * groups * kh * kw, ...)
TOLERANCE = {np.float16: 2e-2, np.float32: 2e-4, np.float64: 1e-9}
EXAMPLES = 30                    # per op; every example runs every lowering
LATEST_OPSET = 21


def _np_dtype(type_str: str):
    elem = getattr(onnx.TensorProto, type_str[len("tensor("):-1].upper())
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem)), elem


@dataclass
class Case:
    dtypes: dict          # type var -> (numpy dtype, onnx elem)
    attrs: dict
    present: list[bool]   # per input
    shapes: list          # per input: list of ints, or None when absent


def _attr_candidates(rng: random.Random, a) -> list:
    """The default first, then values next to it (by type), for the search to try."""
    if a.default is REQUIRED:
        base = {AttrType.INT: 1, AttrType.FLOAT: 1.0, AttrType.INTS: [1, 1], AttrType.FLOATS: [1.0, 1.0]}.get(a.type)
        if base is None:
            return []
    else:
        base = a.type.coerce(a.default)
    if a.type is AttrType.INT:
        others = [base + 1, base + 2, base - 1]
    elif a.type is AttrType.FLOAT:
        others = [base * 0.5, base + 1.0, -base]
    elif a.type is AttrType.INTS:
        others = [[v + rng.choice([0, 1]) for v in base] for _ in range(3)] + [[v + 1 for v in base]]
    elif a.type is AttrType.FLOATS:
        others = [[v * rng.choice([0.5, 1.0, 2.0]) for v in base] for _ in range(3)]
    else:  # STRING: only the default is known to be meaningful
        others = []
    rng.shuffle(others)
    return [base, *others] if rng.random() < 0.5 else [*others, base]


def _accepts(op: OpDef, shapes: list, attrs: dict) -> bool:
    try:
        op.infer_shapes(list(shapes), dict(attrs))
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError):
        return False
    return True


def generate(op: OpDef, rng: random.Random) -> Case | None:
    """A consistent set of dtypes, attributes and input shapes for ``op``, or None."""
    dtypes = {}
    for var, allowed in op.type_constraints.items():
        dtypes[var] = _np_dtype(rng.choice(list(allowed)))
    attrs = {}
    for a in op.attributes:
        candidates = _attr_candidates(rng, a)
        if not candidates:
            return None
        attrs[a.name] = candidates[0]
    n = len(op.inputs)
    present = [not p.optional or rng.random() < 0.6 for p in op.inputs]
    shapes: list = [None] * n
    # attributes: the first candidate set the op accepts with every shape unknown
    for a in op.attributes:
        for value in _attr_candidates(rng, a):
            attrs[a.name] = value
            if _accepts(op, shapes, attrs):
                break
        else:
            return None
    # ranks, then dims, one at a time
    for i in range(n):
        if not present[i]:
            continue
        ranks = list(range(MAX_RANK + 1))
        rng.shuffle(ranks)
        for r in ranks:
            shapes[i] = [None] * r
            if _accepts(op, shapes, attrs):
                break
        else:
            return None
    zero_ok = rng.random() < 0.1
    for i in range(n):
        for k in range(len(shapes[i] or ())):
            small = SMALL[:]
            rng.shuffle(small)
            for d in ([0] if zero_ok else []) + small + LARGER:
                shapes[i][k] = d
                if _accepts(op, shapes, attrs):
                    break
            else:
                return None
    if any(p and s is not None and np.prod(s, dtype=np.int64) > 20_000 for p, s in zip(present, shapes)):
        return None
    return Case(dtypes, attrs, present, shapes)


def _feasible(op: OpDef) -> str | None:
    """None if inputs can be generated for ``op``, else why not."""
    rng = random.Random(0)
    for _ in range(200):
        if generate(op, rng) is not None:
            return None
    missing = [a.name for a in op.attributes if not _attr_candidates(random.Random(0), a)]
    if missing:
        return f"required attribute(s) {missing} without a default of a type values can be made up for"
    return "no shapes found that the op's infer_shapes accepts"


def _model(op: OpDef, case: Case, opset: int) -> onnx.ModelProto:
    names = [p.name if present else "" for p, present in zip(op.inputs, case.present)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op.name, names, [p.name + "_out" for p in op.outputs], domain="custom", name="n0",
                            **{k: v for k, v in case.attrs.items()})
    inputs = [helper.make_tensor_value_info(p.name, case.dtypes[p.type][1], shape)
              for p, shape, present in zip(op.inputs, case.shapes, case.present) if present]
    outputs = [helper.make_tensor_value_info(p.name + "_out", case.dtypes[p.type][1], None) for p in op.outputs]
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)],
                             ir_version=8 if opset < 21 else 10)


def _feeds(op: OpDef, case: Case, seed: int) -> dict[str, np.ndarray]:
    gen = np.random.default_rng(seed)
    feeds = {}
    for p, shape, present in zip(op.inputs, case.shapes, case.present):
        if not present:
            continue
        dtype = case.dtypes[p.type][0]
        if dtype.kind == "f":
            value = gen.standard_normal(shape) * gen.choice([0.5, 1.0, 3.0])
        elif dtype.kind in "iu":
            value = gen.integers(0, 4, size=shape)
        elif dtype.kind == "b":
            value = gen.random(shape) < 0.5
        else:
            raise AssertionError(f"no values for {dtype}")
        feeds[p.name] = np.asarray(value).astype(dtype)
    return feeds


def _reference(op: OpDef, case: Case, feeds: dict) -> list[np.ndarray]:
    import torch

    args = [torch.from_numpy(feeds[p.name].copy()) if present else None
            for p, present in zip(op.inputs, case.present)]
    while args and args[-1] is None and op.inputs[len(args) - 1].optional:
        args.pop()
    out = op.reference(*args, **case.attrs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [o.detach().numpy() for o in outs]


def _lowerings(op: OpDef, case: Case) -> list[tuple[str, Lowering, int]]:
    """(label, lowering, opset): every decomposition at an opset that picks it, then the kernels."""
    out = []
    for dec in op.decompositions:
        top = min(dec.max_opset or LATEST_OPSET, LATEST_OPSET)
        opset = next((o for o in range(dec.min_opset, top + 1) if op.decomposition_for(o) is dec), None)
        if opset is not None:
            out.append((f"decompose:{dec.name}@{opset}", Lowering.DECOMPOSE, opset))
    kernel_opset = max(17, min((d.min_opset for d in op.decompositions), default=17))
    if op.native:
        out.append(("native", Lowering.NATIVE, kernel_opset))
    if op.python_kernel is not None and all(case.present):  # ort-extensions passes no omitted inputs
        out.append(("python", Lowering.PYTHON, kernel_opset))
    return out


# Disagreements found by these tests whose fix belongs to the op's own files: (op, lowering
# label) -> the cases it affects, the report, and a case that reproduces it. Each one is
# reproduced by test_known_problem_still_there (strict xfail: it fails once fixed, so the
# entry gets removed); the property test leaves exactly those cases out until then.
@dataclass
class Known:
    affects: object       # Case -> bool
    report: str
    dtype: str
    shapes: list
    attrs: dict = None


def _dtype_is(name):
    return lambda case: any(d[0] == np.dtype(name) for d in case.dtypes.values())


KNOWN_PROBLEMS = {
    ("deform_conv2d", "decompose:grid_sample@16"): Known(
        _dtype_is("float64"),
        "custom_ops/deform_conv2d/_decompose.py::grid_sample emits GridSample(16) (and Conv) for double "
        "inputs; ONNX Runtime's CPU kernels for both are float only ('Could not find an implementation for "
        "GridSample(16)'). The lowering choice never picks it for double (tests/test_selection.py); a "
        "double-capable form would Cast around them",
        "tensor(double)", [[1, 1, 3, 3], [1, 1, 2, 2], [1, 8, 2, 2], [1], None]),
    ("deform_conv2d", "decompose:gather@11"): Known(
        _dtype_is("float64"),
        "custom_ops/deform_conv2d/_decompose.py::gather ends in Conv for double inputs; ONNX Runtime's CPU "
        "Conv is float only ('Could not find an implementation for Conv(11)'). The lowering choice never "
        "picks it for double (tests/test_selection.py); a double-capable form would Cast around the Conv",
        "tensor(double)", [[1, 1, 3, 3], [1, 1, 2, 2], [1, 8, 2, 2], [1], None]),
}


def _known_problem(op: OpDef, label: str, case: Case) -> bool:
    entry = KNOWN_PROBLEMS.get((op.name, label))
    return entry is not None and bool(entry.affects(case))


def _check(op: OpDef, case: Case, seed: int, only: str | None = None) -> None:
    feeds = _feeds(op, case, seed)
    expected = _reference(op, case, feeds)
    for label, lowering, opset in _lowerings(op, case):
        if only is not None and label != only:
            continue
        if only is None and _known_problem(op, label, case):
            continue
        model = _model(op, case, opset)
        out, report = rewrite_model(model, lowering=lowering)
        kind = {Lowering.DECOMPOSE: "decompose:", Lowering.NATIVE: "bind:native",
                Lowering.PYTHON: "bind:python"}[lowering]
        assert any(how.startswith(kind) for _, how in report.actions), (label, report.actions)
        got = open_session(out).run(feeds)
        for p, want in zip(op.outputs, expected):
            actual = got[p.name + "_out"]
            assert actual.dtype == want.dtype, (label, actual.dtype, want.dtype)
            assert actual.shape == want.shape, (label, actual.shape, want.shape)
            tol = TOLERANCE[want.dtype.type]
            scale = float(np.max(np.abs(want.astype(np.float64)), initial=1.0))
            np.testing.assert_allclose(actual.astype(np.float64), want.astype(np.float64), rtol=tol,
                                       atol=tol * scale, err_msg=f"{op.name} {label} vs torch reference")


REGISTRY = discover(entry_points=False, environment=False)  # graphkit's own ops, whatever is installed


def _params():
    for op in REGISTRY:
        why = _feasible(op)
        marks = [pytest.mark.skip(reason=f"op {op.name}: cannot generate its inputs: {why}")] if why else []
        yield pytest.param(op.name, id=op.name, marks=marks)


@pytest.mark.parametrize("name", list(_params()))
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False), seed=st.integers(0, 2**16))
def test_every_lowering_matches_the_torch_reference(name, rng, seed):
    op = REGISTRY.get(name)
    case = generate(op, rng)
    assume(case is not None)
    note(f"{name}: dtypes {[d[0].name for d in case.dtypes.values()]}, attrs {case.attrs}, "
         f"shapes {case.shapes}, lowerings {[lbl for lbl, _, _ in _lowerings(op, case)]}")
    _check(op, case, seed)


def test_every_op_is_covered():
    """The registry is iterated, not listed: an op added to custom_ops/ is tested (or skipped
    with its name) without touching this file."""
    import graphkit_ops

    assert {op.name for op in REGISTRY} == {op.name for op in graphkit_ops.ALL_OPS}
    covered = [op.name for op in REGISTRY if _feasible(op) is None]
    assert "my_add" in covered
    for op in REGISTRY:
        if _feasible(op) is None:
            case = generate(op, random.Random(1))
            while case is None:
                case = generate(op, random.Random())
            assert _lowerings(op, case), f"{op.name} has no lowering to compare"


def _known_params():
    for (name, label), known in KNOWN_PROBLEMS.items():
        marks = [pytest.mark.xfail(strict=True, reason=known.report)]
        if REGISTRY.get(name) is None:
            marks = [pytest.mark.skip(reason=f"op {name} is not in the registry any more")]
        yield pytest.param(name, label, known, id=f"{name}-{label}", marks=marks)


@pytest.mark.parametrize("name,label,known", list(_known_params()))
def test_known_problem_still_there(name, label, known):
    """The reproduction of a KNOWN_PROBLEMS entry: passes (and so fails, strict) once fixed."""
    op = REGISTRY.get(name)
    attrs = dict(known.attrs or {})
    for a in op.attributes:
        attrs.setdefault(a.name, a.type.coerce(a.default))
    case = Case({var: _np_dtype(known.dtype) for var in op.type_constraints}, attrs,
                [s is not None for s in known.shapes] + [False] * (len(op.inputs) - len(known.shapes)),
                list(known.shapes) + [None] * (len(op.inputs) - len(known.shapes)))
    assert known.affects(case)
    picked = [x for x in _lowerings(op, case) if x[0] == label]
    assert picked, f"{label} is not a lowering of {name} any more"
    _check(op, case, 0, only=label)
