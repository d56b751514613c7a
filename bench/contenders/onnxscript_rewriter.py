"""onnxscript's pattern rewriter doing the same decomposition."""
import sys

from onnxscript import ir
from onnxscript.rewriter import pattern, rewrite


def target(op, a, b):
    return op.my_add(a, b, _domain="custom")


def replacement(op, a, b):
    return op.Add(op.Mul(a, op.Constant(value_float=2.0)), b)


model = ir.load(sys.argv[1])
model = rewrite(model, pattern_rewrite_rules=[pattern.RewriteRule(target, replacement)])
model.opset_imports.pop("custom", None)
ir.save(model, sys.argv[2])
