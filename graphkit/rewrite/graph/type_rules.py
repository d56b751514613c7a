"""The forward typing rules: a node's output element types from its inputs' (the common
standard ops, a registry op's type variables), what :class:`~graphkit.rewrite.graph.types.TypeTable`
runs over the nodes, node by node (``forward_node``) or over fields read in bulk (``rule_code``).
If/Loop/Scan outputs from their bodies' stay in the table (they need the bodies' tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx

from graphkit.rewrite.graph.walk import AI_ONNX

__all__ = ["CONTROL_FLOW_BODY", "FIXED_TYPES", "SAME_AS_INPUT0", "SECOND_OUTPUT", "OpRule", "forward_node",
           "rule_code"]

_T = onnx.TensorProto

# Standard ops whose outputs all have the element type of input 0.
SAME_AS_INPUT0 = frozenset("""
    Abs Acos Acosh Add AveragePool BatchNormalization Ceil Celu Clip Concat Conv ConvTranspose Cos
    Cosh CumSum DepthToSpace Div Dropout Einsum Elu Erf Exp Expand Flatten Floor Gather GatherElements
    GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool HardSigmoid HardSwish Hardmax Identity
    InstanceNormalization LayerNormalization LeakyRelu Log LogSoftmax LpNormalization MatMul Max MaxPool
    Mean Min Mish Mod Mul Neg Pad Pow PRelu Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Round Selu
    Shrink Sigmoid Sign Sin Sinh Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum
    Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample DeformConv GridSample RoiAlign
    Asin Asinh Atan Atanh
""".split())
FIXED_TYPES = {"Shape": _T.INT64, "Size": _T.INT64, "NonZero": _T.INT64, "ArgMax": _T.INT64, "ArgMin": _T.INT64,
               "Equal": _T.BOOL, "Less": _T.BOOL, "Greater": _T.BOOL, "LessOrEqual": _T.BOOL,
               "GreaterOrEqual": _T.BOOL, "Not": _T.BOOL, "And": _T.BOOL, "Or": _T.BOOL, "Xor": _T.BOOL,
               "IsNaN": _T.BOOL, "IsInf": _T.BOOL}
# Outputs after the first that have a fixed type.
SECOND_OUTPUT = {"TopK": _T.INT64, "MaxPool": _T.INT64, "Dropout": _T.BOOL}
CONTROL_FLOW_BODY = {"If": "then_branch", "Loop": "body", "Scan": "body"}
# forward_fields' rule per (domain, op type); the first two: typed as input 0
SAME, FIRST_INPUT, NONE, OP, GENERAL, HOLDER = range(6)


class OpRule:
    """The forward rule for a registry op: outputs take the type bound to their type variable."""

    def __init__(self, opdef: Any) -> None:
        self.in_vars = [p.type for p in opdef.inputs]
        self.out_vars = [p.type for p in opdef.outputs]
        # One type variable for every input and the single output: the output takes the
        # type of the first typed input.
        self.first_input = len(self.out_vars) == 1 and set(self.in_vars) == set(self.out_vars)

    def outputs(self, in_types: tuple) -> list:
        bound: dict[str, int] = {}
        for var, t in zip(self.in_vars, in_types):
            if t is not None:
                bound.setdefault(var, t)
        return [bound.get(var) for var in self.out_vars]


def rule_code(domain: str, op: str, registry: Any = None) -> tuple[int, OpRule | None]:
    """The rule for nodes of (``domain``, ``op``): one of the codes above, and a registry op's rule."""
    std = domain in AI_ONNX
    if std and op in SAME_AS_INPUT0:
        return SAME, None
    if std and (op in FIXED_TYPES or op in ("Cast", "Constant", "ConstantOfShape", "CastLike", "Where")):
        return GENERAL, None
    if registry is not None:
        opdef = registry.lookup(domain, op)
        if opdef:
            rule = OpRule(opdef)
            return (FIRST_INPUT if rule.first_input else OP), rule
    return NONE, None


def forward_node(elem: dict[str, int], get: Callable[[str], int | None], node: onnx.NodeProto, domain: str,
                 op: str, registry: Any = None) -> None:
    """Fill in ``elem`` with ``node``'s output element types from its inputs' (read through
    ``get``), where a rule knows them; a name already typed keeps its type."""
    std = domain in AI_ONNX
    if std and op in SAME_AS_INPUT0 and node.input and (t := get(node.input[0])) is not None:
        for i, out in enumerate(node.output):
            elem.setdefault(out, SECOND_OUTPUT.get(op, t) if i else t)
    elif std and op in FIXED_TYPES:
        for out in node.output:
            elem.setdefault(out, FIXED_TYPES[op])
    elif std and op in ("Cast", "Constant", "ConstantOfShape"):
        for a in node.attribute:
            if a.name == "to":
                elem.setdefault(node.output[0], a.i)
            elif a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                elem.setdefault(node.output[0], a.t.data_type)
        if op == "ConstantOfShape":
            elem.setdefault(node.output[0], _T.FLOAT)
    elif std and op in ("CastLike", "Where") and len(node.input) > 1 and (t := get(node.input[1])) is not None:
        elem.setdefault(node.output[0], t)
    elif registry is not None and (opdef := registry.lookup(domain, op)):
        bound = {}
        for p, name in zip(opdef.inputs, node.input):
            t = get(name)
            if t is not None:
                bound.setdefault(p.type, t)
        for p, out in zip(opdef.outputs, node.output):
            if p.type in bound:
                elem.setdefault(out, bound[p.type])
