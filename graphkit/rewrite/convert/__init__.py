"""ai.onnx opset conversion by graphkit's own adapters (``--target-opset``)."""
