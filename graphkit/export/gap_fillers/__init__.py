"""GAP_FILLERS: symbolics for ATen ops torch 2.13's TorchScript exporter cannot export.

Every row is a real gap at opsets 17-20 (``python -m graphkit.export.gaps`` finds them by
exporting small models; the tests check each row's examples against torch in ONNX
Runtime). A row is: the ATen op, the first opset holding every ONNX op it writes, the
symbolic, what it writes, and examples. Symbolics take the ATen op's arguments in the
order of ``torch/_C/_VariableFunctions.pyi`` (the tutorial's recipe for ``asinh``).

Dtypes and exactness (tests/test_edges.py checks every row on a grid of hard values in
float16, float32, float64, int64 and float32 with float64, against torch eager):

- the result has torch's dtype: integer inputs promote to float32 (``exp2(arange(8))``),
  float32 with float64 to float64, a 0-dim constant counts as a Python scalar
  (``xlogy(2.0, float32)`` is float32); integer-valued ops stay integer (``l1_loss``,
  ``fmax``, ``heaviside`` of int64);
- float16 is computed in float32 and rounded once, as torch's CPU kernels do (``sinc``);
  compositions whose float32 steps would each round (``hypot``, ``expm1``, ``logaddexp``,
  ``xlogy``, ``ldexp``, ``erfc``...) run in float64 and are rounded once;
- range: ``hypot`` has no overflow or underflow, ``ldexp`` covers every exponent,
  ``log1p`` is exact (``xlog1py``, ``logaddexp``), ``erfc`` has its tail (``erfc(4)`` is
  1.54e-8 in float32);
- signed zeros survive: ONNX Runtime's Where returns +0.0 for a -0.0 from its true branch,
  so signs are set by multiplication (``blocks.py``: ``with_sign``, ``select``).

A row's ``tolerance`` says how close it is where the default (two ulps) is not met, its
``semantics`` where it departs from torch on purpose (``copysign(1, -nan)``: a NaN's sign
bit is invisible to ONNX before opset 26), and ``unsupported`` the dtypes ONNX Runtime's CPU
provider cannot run. Asinh, Acosh, Atanh, Sinh, Cosh and Erf exist there for float and
float16 only: their rows write float64 with ops that have double kernels (Log, Exp, Sqrt,
Div...), without overflow or cancellation (``unary.py``: ``_asinh_double`` and its neighbours;
erf and erfc as fdlibm computes them, within a few ulps: :mod:`graphkit.export._erf_double`).

Which file holds what: the rows by op family, each module its symbolics, their examples
and ``ROWS``: ``unary.py`` (trigonometry, rounding, exponentials, logs, error functions,
scaling, sign, shape), ``binary.py``, ``losses.py`` (and broadcast_tensors), ``sequences.py``
(diff and cumsum, found by exporting real architectures); what they share: ``dtypes.py``
(torch dtypes of values, casts, type promotion, :func:`~graphkit.export.gap_fillers.dtypes.floating`),
``blocks.py`` (signed zeros, log1p), ``examples.py`` (the examples' inputs).
"""

from __future__ import annotations

from graphkit.export.aten import GapFillerTable
from graphkit.export.gap_fillers import binary, losses, sequences, unary

GAP_FILLERS = GapFillerTable([*unary.ROWS, *binary.ROWS, *losses.ROWS, *sequences.ROWS])
