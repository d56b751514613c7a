"""The floor: load and save the model with onnx, nothing else."""
import sys

import onnx

onnx.save(onnx.load(sys.argv[1]), sys.argv[2])
