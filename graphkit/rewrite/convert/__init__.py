"""ai.onnx opset conversion by graphkit's own adapters (``--target-opset``).

- ``opset.py``: the pass, :func:`~graphkit.rewrite.convert.opset.convert` (one walk over every
  graph, subgraph and function body), and ``NodeConverter`` (the same adapters on main-graph
  nodes one at a time, for the byte writer); what callers import;
- ``steps.py``: the steps between two opsets, op by op, and the tables from ONNX's changelog
  that decide each step's kind;
- ``adapters.py``: one adapter per kind of step, changing or checking one node;
- ``functions.py``: going down, ops the target lacks made ONNX's function bodies for them;
- ``by_onnx.py``: the nodes no adapter covers, converted by onnx's version converter;
- ``state.py``: what these share: a conversion's state, the constants a node reads, the
  node lists walked.
"""
