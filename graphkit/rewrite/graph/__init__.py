"""The model as the rewrite sees it: every graph, subgraph and function body (walk.py), the
one type table of its tensors, whatever asks (types.py: TypeTable; ``TypeTable.inferred``:
ONNX shape inference's types alone, per scope), the scopes rules and
passes rewrite (scopes.py), an index of one node list (view.py) and the edits rules and
passes share (edit.py).
"""
