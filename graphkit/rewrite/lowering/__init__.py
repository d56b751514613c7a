"""Lowering: what each custom:: placeholder becomes.

- plan.py: the lowering plan, decided once per kind of node; ``LoweringPlan.lower`` is where a
  placeholder becomes standard ops, whichever writer runs;
- selection.py: which lowering a node gets (the first ONNX Runtime can execute);
- builder.py: how decompositions add standard ONNX nodes;
- binding.py: the one place a node bound to a kernel is made;
- standard_ops.py: standard ONNX nodes that are graphkit ops (ai.onnx DeformConv).
"""
