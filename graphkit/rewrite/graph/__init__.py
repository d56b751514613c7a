"""The model as the rewrite sees it: every graph, subgraph and function body (walk.py), the
one type table of its tensors, whoever asks (types.py: TypeTable), the forward typing rules it
runs over the nodes (type_rules.py: SAME_AS_INPUT0, FIXED_TYPES, a registry op's rule), what
ONNX shape inference states per scope (inference.py: infer_types, Inferred; what
``TypeTable.inferred`` is built from, the simplify passes' types included; skeleton, the
model inference runs on without its large weights), the scopes rules and passes rewrite (scopes.py), an
index of one node list (view.py) and the edits rules and passes share (edit.py).
"""
