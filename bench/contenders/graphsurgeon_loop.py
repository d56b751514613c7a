"""A naive onnx-graphsurgeon rewrite: import, replace, cleanup, toposort, export, save."""
import sys

import numpy as np
import onnx
import onnx_graphsurgeon as gs

graph = gs.import_onnx(onnx.load(sys.argv[1]))
for node in [n for n in graph.nodes if n.domain == "custom" and n.op == "my_add"]:
    a, b = node.inputs
    y = node.outputs[0]
    two = gs.Constant(node.name + "_two", np.array(2, dtype=np.float32))
    tmp = gs.Variable(node.name + "_mul", dtype=a.dtype)
    graph.nodes.append(gs.Node("Mul", node.name + "/Mul", inputs=[a, two], outputs=[tmp]))
    graph.nodes.append(gs.Node("Add", node.name + "/Add", inputs=[tmp, b], outputs=[y]))
    node.outputs.clear()
graph.cleanup().toposort()
model = gs.export_onnx(graph)
keep = [o for o in model.opset_import if o.domain != "custom"]
del model.opset_import[:]
model.opset_import.extend(keep)
onnx.save(model, sys.argv[2])
