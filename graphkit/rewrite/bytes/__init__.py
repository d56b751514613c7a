"""The byte writers: replacements spliced into the serialized model instead of parsing,
rewriting and serializing it again (graphkit.rewrite.writers says which runs when).

- main_graph.py: custom:: placeholders in the main graph;
- bodies.py with body_splice.py: placeholders in If branches, Loop and Scan bodies;
- conversions.py: --target-opset conversions, spliced;
- common.py: what they share (lowerings repeated as bytes, element types without inference);
- wire.py: the protobuf wire format as they read and write it.
"""
