"""The byte writers: replacements spliced into the serialized model instead of parsing,
rewriting and serializing it again (graphkit.rewrite.writers says which runs when).

- main_graph.py: custom:: placeholders in the main graph;
- bodies.py: placeholders in If branches, Loop and Scan bodies (the rewrite, its steps), with
  body_scopes.py (the pass typing the model and listing the graphs holding placeholders;
  body_bulk.py its read of every subgraph's declarations a block of graphs at a time),
  body_repeats.py (repeats and adoptions written many at a time) and body_splice.py (the
  graphs written again around their new entries);
- columns.py: fields of many serialized messages read at once;
- conversions.py: --target-opset conversions, spliced;
- common.py: what the writers share: the steps both take (reading the model's top level,
  preconditions, the lowering plan, the check of the output), lowerings repeated as bytes,
  the type table's policy (element types without ONNX inference), names, the output;
- wire.py: the protobuf wire format as they read and write it.
"""
