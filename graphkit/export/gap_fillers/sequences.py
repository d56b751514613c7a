"""Gap fillers found by exporting real architectures (bench/zoo.py): transformers' masking
code looks for packed sequences with torch.diff and a cumsum of bool (GPT-2, Llama,
Whisper) (:data:`ROWS`)."""

from __future__ import annotations

import torch
from torch.onnx import symbolic_helper

from graphkit.export.aten import Example, GapFiller
from graphkit.export.gap_fillers.dtypes import ELEMENT_TYPES, SCALAR_TYPES, cast_to, compute_type, dtype_of
from graphkit.export.gap_fillers.examples import INF, NAN, example

__all__ = ["ROWS"]


@symbolic_helper.parse_args("v", "i", "i", "v", "v")
def _diff(g, x, n, dim, prepend, append):
    """torch.diff: ``prepend``/``append`` concatenated along ``dim`` (all promoted to one
    type, as torch.cat does), then ``n`` times ``x[1:] - x[:-1]`` (logical xor for bool)."""
    parts = [v for v in (prepend, x, append) if not symbolic_helper._is_none(v)]
    dtype = dtype_of(x)
    for v in parts:
        other = dtype_of(v)
        dtype = None if dtype is None or other is None else torch.promote_types(dtype, other)
    if len(parts) > 1:
        x = g.op("Concat", *[cast_to(g, v, dtype) for v in parts], axis_i=dim)
    if n == 0:
        return x
    work = compute_type(dtype)
    x = cast_to(g, x, work)
    starts = [g.op("Constant", value_t=torch.tensor([v])) for v in (1, 0)]
    ends = [g.op("Constant", value_t=torch.tensor([v])) for v in (2**63 - 1, -1)]
    axes = g.op("Constant", value_t=torch.tensor([dim]))
    for k in range(n):
        upper = g.op("Slice", x, starts[0], ends[0], axes)
        lower = g.op("Slice", x, starts[1], ends[1], axes)
        x = g.op("Xor" if dtype == torch.bool else "Sub", upper, lower)
        if work != dtype and dtype is not None and dtype.is_floating_point and k < n - 1:
            # torch rounds each difference to float16 (found by tests/test_edges.py, n = 2)
            x = g.op("Cast", g.op("Cast", x, to_i=ELEMENT_TYPES[dtype]), to_i=ELEMENT_TYPES[work])
    return x if work == dtype else g.op("Cast", x, to_i=ELEMENT_TYPES[dtype])


@symbolic_helper.parse_args("v", "i", "none")
def _cumsum(g, x, dim, dtype=None):
    """torch.cumsum: bool and integer inputs sum in int64 as torch's do (torch's symbolic
    writes a bool or int8 CumSum, which ONNX Runtime has no kernel for, and sums int32 in
    int32), ``dtype=`` is honoured, float16 accumulates in float32 and float32 in float64
    (torch's CPU accumulation types)."""
    have = dtype_of(x)
    if dtype is not None and not symbolic_helper._is_none(dtype):
        want = SCALAR_TYPES.get(symbolic_helper._get_const(dtype, "i", "dtype"))
    elif have is not None and not have.is_floating_point:
        want = torch.int64
    else:
        want = have
    # torch's CPU cumsum accumulates float32 in double (its acc_type) and rounds each sum
    work = torch.float64 if want == torch.float32 else compute_type(want)
    axis = g.op("Constant", value_t=torch.tensor(dim, dtype=torch.int64))
    y = g.op("CumSum", cast_to(g, x, work), axis)
    if work != want:
        y = g.op("Cast", y, to_i=ELEMENT_TYPES[want])
    if want is not None and want.is_floating_point:
        # torch sums from +0.0: cumsum(-0.0) is 0.0 (after the Cast: ONNX Runtime's
        # optimizer drops a double Add of 0)
        y = g.op("Add", y, g.op("Constant", value_t=torch.tensor(0.0, dtype=want)))
    return y


def _diff_examples() -> tuple[Example, ...]:
    def positions(gen):  # transformers' find_packed_sequence_indices
        ids = torch.tensor([[0, 1, 2, 0, 1, 5, 6], [3, 4, 5, 6, 7, 8, 9]])
        return (ids,)

    def packed(ids):
        return torch.diff(ids, prepend=ids[:, :1] - 1, dim=-1)

    return (
        example(packed, positions, "int64 prepend"),
        example(lambda x: torch.diff(x, n=2, dim=0), lambda gen: (torch.randn(5, 3, generator=gen),), "n=2 dim=0"),
        example(lambda x: torch.diff(x.view(3, -1), append=x.view(3, -1)[:, -2:] * 2),
            lambda gen: (torch.tensor([0.0, -0.0, INF, -INF, NAN, 1e38, -1e38, 3.5, 1e-40, 2.0, 7.0, -4.0]),),
            "append, edge values"),
        example(lambda x: torch.diff(x > 0), lambda gen: (torch.randn(2, 9, generator=gen),), "bool"),
        example(lambda x: torch.diff(x), lambda gen: (torch.tensor([[100, -100, 127, -128, 0]], dtype=torch.int8),),
            "int8 wraps"),
        example(lambda x: torch.diff(x), lambda gen: (torch.tensor([65504.0, -65504.0, 1e-3, 1.0], dtype=torch.float16),),
            "float16"),
        example(lambda x: torch.diff(x, prepend=torch.full((2, 1), 0.5)),
            lambda gen: (torch.tensor([[1, 4, 9], [2, 2, 2]]),), "int64 x, float prepend"),
        example(lambda x: torch.diff(x, n=4), lambda gen: (torch.randn(2, 3, generator=gen),), "n > length"),
    )


def _cumsum_examples() -> tuple[Example, ...]:
    def ids(gen):
        return (torch.tensor([[0, 1, 2, 0, 1, 5, 6], [3, 4, 5, 6, 7, 8, 9]]),)

    return (
        example(lambda x: (torch.diff(x, prepend=x[:, :1] - 1) != 1).cumsum(-1), ids, "bool (transformers)"),
        example(lambda x: torch.cumsum(x, 0), lambda gen: (torch.randn(4, 3, generator=gen),), "float32"),
        example(lambda x: torch.cumsum(x.to(torch.int32), 1), ids, "int32 -> int64"),
        example(lambda x: torch.cumsum(x.to(torch.int8) * 60, 1, dtype=torch.int8), ids, "dtype=int8 wraps"),
        example(lambda x: torch.cumsum(x, 1, dtype=torch.float64), lambda gen: (torch.randn(2, 5, generator=gen),),
            "dtype=float64"),
        example(lambda x: torch.cumsum(x, -1), lambda gen: (torch.tensor([[60000.0, 5000.0, 1e-4, -65504.0]],
                                                                     dtype=torch.float16),), "float16"),
    )


ROWS = [
    # found by exporting real architectures (bench/zoo.py): transformers' masking code looks
    # for packed sequences with torch.diff and a cumsum of bool (GPT-2, Llama, Whisper)
    GapFiller("aten::diff", 11, _diff, "Concat(prepend, x, append), n x (Slice(1:) - Slice(:-1))",
              _diff_examples()),
    GapFiller("aten::cumsum", 11, _cumsum, "CumSum(Cast(x)) in int64 for bool and integers",
              _cumsum_examples(),
              replaces="torch writes CumSum of bool and int8 (ONNX Runtime has no kernel for "
                       "them) and of int32 (torch returns int64)"),
]
