"""bytes.columns and body_bulk.main_nodes: fields of many serialized messages read at once
give what parsing each message alone gives, whether every message has as many values of a
field as the others (read by slicing) or not (cut one by one)."""

from __future__ import annotations

import collections
import random

import onnx
import pytest
from onnx import TensorProto, helper

from graphkit.rewrite.bytes import body_bulk, wire
from graphkit.rewrite.bytes.columns import HOLDER_FIELDS, NODE_FIELDS, NotBulk, graph_columns, read_columns


def _nodes(rng: random.Random, n: int, uniform: bool) -> list[onnx.NodeProto]:
    """``n`` nodes, each with as many inputs, outputs, attributes, names and domains as the others where ``uniform``."""
    out = []
    for i in range(n):
        k = 2 if uniform else rng.randint(0, 3)
        attributes = {"alpha": 0.5} if uniform or rng.random() < 0.5 else {}
        if not uniform and rng.random() < 0.3:
            body = helper.make_graph([helper.make_node("Relu", ["a"], [f"b{i}"])], "g", [],
                                     [helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT, [])])
            attributes["then_branch"] = body
        out.append(helper.make_node(rng.choice(["Add", "Relu", "If"]), [f"x{i}_{j}" for j in range(k)],
                                    [f"y{i}_{j}" for j in range(1 if uniform else rng.randint(0, 2))],
                                    name=f"n{i}" if uniform or rng.random() < 0.5 else None,
                                    domain="custom" if uniform or rng.random() < 0.5 else "", **attributes))
    return out


def _one_by_one(nodes: list[onnx.NodeProto], fields: tuple) -> dict:
    """What read_columns gives, field by field of each node parsed alone."""
    out: dict = {}
    for name, _, kind, last in fields:
        if last:
            out[name] = [getattr(node, name) for node in nodes]
        else:
            values = [list(getattr(node, name)) for node in nodes]
            if kind is bytes:
                values = [[v.SerializeToString() for v in vs] for vs in values]
            out[name] = ([v for vs in values for v in vs], [len(vs) for vs in values])
    return out


@pytest.mark.parametrize("uniform", [True, False])
def test_read_columns_is_each_message_read_alone(uniform):
    rng = random.Random(7)
    sk = wire.Skeletons.load()
    for trial in range(40):
        nodes = _nodes(rng, rng.randint(1, 9), uniform)
        data = [node.SerializeToString() for node in nodes]
        for fields in (NODE_FIELDS, HOLDER_FIELDS):
            assert read_columns(sk.nodes, data, fields) == _one_by_one(nodes, fields)


@pytest.mark.parametrize("uniform", [True, False])
def test_graph_columns_is_each_graph_read_alone(uniform):
    rng = random.Random(11)
    for trial in range(40):
        graphs = []
        for g in range(rng.randint(1, 7)):
            k = 2 if uniform else rng.randint(0, 3)
            n_in, n_out = (1, 1) if uniform else (rng.randint(0, 2), rng.randint(0, 2))
            graphs.append(helper.make_graph(
                [helper.make_node("Relu", [f"a{g}"], [f"b{g}_{i}"]) for i in range(k)], f"g{g}",
                [helper.make_tensor_value_info(f"a{g}", TensorProto.FLOAT, [])] * n_in,
                [helper.make_tensor_value_info(f"b{g}_0", TensorProto.FLOAT, [])] * n_out))
        got = graph_columns([g.SerializeToString() for g in graphs])
        for name in ("node", "initializer", "input", "output", "value_info"):
            values = [[v.SerializeToString() for v in getattr(g, name)] for g in graphs]
            assert got[name] == ([v for vs in values for v in vs], [len(vs) for vs in values]), name


def test_a_message_holding_the_end_mark_is_not_read_in_bulk():
    sk = wire.Skeletons.load()
    nodes = [helper.make_node("Relu", ["x"], [o]).SerializeToString() for o in ("y", "\x00graphkit\x00")]
    with pytest.raises(NotBulk):
        read_columns(sk.nodes, nodes, NODE_FIELDS)


def test_main_nodes_are_the_parsed_nodes():
    rng = random.Random(3)
    for trial in range(20):
        nodes = _nodes(rng, rng.randint(0, 12), uniform=False)
        graph = helper.make_graph(nodes, "main", [], [])
        model = helper.make_model(graph)
        data = model.SerializeToString()
        _, _, g0, g1 = next(e for e in wire.entries(data, 0, len(data)) if e[0] == wire.MODEL_GRAPH)
        starts, ends, _ = wire.node_entries(data, g0, g1)
        read = body_bulk.main_nodes(data, (starts, ends))
        holders = [i for i, node in enumerate(nodes)
                   if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute)]
        assert read.holders == holders
        assert (read.domains, read.op_types) == ([n.domain for n in nodes], [n.op_type for n in nodes])
        assert read.made == collections.Counter(o for node in nodes for o in node.output)
        assert read.held == _one_by_one([nodes[i] for i in holders], HOLDER_FIELDS)
