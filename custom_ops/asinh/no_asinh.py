"""Rules for runtimes without ``Asinh``: every ``Asinh`` and ``custom::asinh`` node becomes
the ``log_sqrt`` composition (elementary ops only: no Asinh, no Where).

    graphkit rewrite model.onnx model.noasinh.onnx --rules graphkit_ops.asinh.no_asinh

The composition is the op definition's own ``log_sqrt`` decomposition (one definition).
"""

from __future__ import annotations

from graphkit.rewrite import Rule, RuleSet

from . import log_sqrt


def _rewrite(op, x0):
    return log_sqrt(op, [x0], {})[0]


rules = RuleSet([
    Rule.node("asinh_to_log_sqrt", "Asinh", _rewrite),
    Rule.node("custom_asinh_to_log_sqrt", "asinh", _rewrite, domain="custom"),
])
