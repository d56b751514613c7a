"""The fusion library (graphkit.rewrite.fusions) on real architectures exported by torch.

Each architecture (tests/fusion_models.py) is exported once per module and exporter;
every test counts the fusions made (one per LayerNorm, GELU, Conv+BN, ... of the model)
and compares ONNX Runtime on the fused model with ORT on the original and torch eager.
The refusal path of each fusion is shown on a small inline model.
"""

from __future__ import annotations

import collections
import re
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from conftest import run_cli, run_ort
from graphkit.errors import UsageError
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.rewrite import fusions

LAYERS = 2
ENCODER_LAYERNORMS = 1 + 2 * LAYERS  # the embeddings' and two per layer
TOKENS = 8


def _export(model, args, path, dynamo: bool, opset: int, **kw) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=dynamo, opset_version=opset, **kw)


class Exported:
    """One exported architecture: the ONNX model, the feeds and torch's outputs."""

    def __init__(self, model: onnx.ModelProto, feeds: dict, expected: list[np.ndarray]) -> None:
        self.model, self.feeds, self.expected = model, feeds, expected


def _encoder(tmp, exporter: str) -> Exported:
    import torch

    import fusion_models as fm

    ids = torch.randint(0, 40, (2, TOKENS), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    if exporter == "torchscript":
        # nn.LayerNorm decomposes below opset 17. A freshly built model (LayerNorm weights 1,
        # biases 0): the exporter shares the equal parameters through Identity nodes.
        model, path = fm.Encoder(layers=LAYERS, norm="torch").eval(), tmp / "enc.ts.onnx"
        _export(model, (ids,), path, dynamo=False, opset=16)
    else:
        # torch.export always emits LayerNormalization for nn.LayerNorm: a hand-written one.
        model = fm.randomize(fm.Encoder(layers=LAYERS, norm="manual"))
        path = tmp / f"enc.{exporter}.onnx"
        _export(model, (ids,), path, dynamo=True, opset=18, optimize=exporter == "dynamo")
    with torch.no_grad():
        expected = [t.numpy() for t in model(ids)]
    onnx_model = onnx.load(str(path))
    return Exported(onnx_model, {onnx_model.graph.input[0].name: ids.numpy()}, expected)


def _resnet(tmp, exporter: str) -> Exported:
    import torch

    import fusion_models as fm

    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(1)
    if exporter == "torchscript":
        # torchvision's Conv(bias=False); PRESERVE keeps the BatchNormalization nodes the
        # exporter would otherwise fold itself (the model is in eval mode either way).
        model, path = fm.randomize(fm.ResNet(bias=False)), tmp / "cnn.ts.onnx"
        _export(model, (x,), path, dynamo=False, opset=16, training=torch.onnx.TrainingMode.PRESERVE)
    else:
        # torch.export's optimizer folds BN itself; unoptimized, and with Conv biases (a
        # bias-free Conv gets a computed zero bias there).
        model, path = fm.randomize(fm.ResNet(bias=True)), tmp / "cnn.dynamo.onnx"
        _export(model, (x,), path, dynamo=True, opset=18, optimize=False)
    with torch.no_grad():
        expected = [model(x).numpy()]
    onnx_model = onnx.load(str(path))
    return Exported(onnx_model, {onnx_model.graph.input[0].name: x.numpy()}, expected)


def _transformer(tmp, kind: str, exporter: str) -> Exported:
    """transformers' BertModel / GPT2Model (tiny, random weights); GPT-2's TorchScript export
    fails (aten::diff in its mask code), the dynamo one is what there is."""
    import torch

    import fusion_models as fm

    ids = torch.randint(0, 40, (2, TOKENS), generator=torch.Generator().manual_seed(2))
    model, path = fm.transformer(kind, layers=LAYERS), tmp / f"{kind}.{exporter}.onnx"
    _export(model, (ids,), path, dynamo=exporter == "dynamo", opset=18 if exporter == "dynamo" else 17,
            input_names=["ids"])
    with torch.no_grad():
        expected = [model(ids).numpy()]
    return Exported(onnx.load(str(path)), {"ids": ids.numpy()}, expected)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported("encoder", "dynamo")``: exported on first use, once per module (needs torch;
    the inline-model tests below do not)."""
    pytest.importorskip("torch")
    cache: dict = {}
    tmp = tmp_path_factory.mktemp("fusions")

    def get(arch: str, exporter: str) -> Exported:
        if (arch, exporter) not in cache:
            if arch in ("bert", "gpt2"):
                cache[arch, exporter] = _transformer(tmp, arch, exporter)
            else:
                cache[arch, exporter] = {"encoder": _encoder, "resnet": _resnet}[arch](tmp, exporter)
        return cache[arch, exporter]

    return get


BOTH = pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])


def ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def unused_initializers(model: onnx.ModelProto) -> set[str]:
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    return {t.name for t in model.graph.initializer} - used


def fuse(ex: Exported, spec: str, target_opset: int | None = None):
    fused, report = rewrite_model(ex.model, rules=fusions.rule_set(spec), lowering=Lowering.KEEP,
                                  target_opset=target_opset)
    assert [o.name for o in fused.graph.output] == [o.name for o in ex.model.graph.output]
    assert unused_initializers(fused) <= unused_initializers(ex.model)  # what a fusion frees is pruned
    original = run_ort(ex.model, ex.feeds)
    for got, want, ref in zip(run_ort(fused, ex.feeds), original, ex.expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # ORT: fused vs original
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)   # vs torch eager
    return fused, report


def reasons(report, rule: str) -> str:
    return "\n".join(report.rules.reasons.get(rule, []))


# ---------------------------------------------------------------- on exported models

@BOTH
def test_layernorm_on_encoder(exported, exporter):
    ex = exported("encoder", exporter)
    before = ops(ex.model)
    assert before["Sqrt"] == ENCODER_LAYERNORMS and "LayerNormalization" not in before
    fused, report = fuse(ex, "layernorm", target_opset=17 if exporter == "torchscript" else None)
    assert report.rules.applied == {"layernorm": ENCODER_LAYERNORMS}
    after = ops(fused)
    assert after["LayerNormalization"] == ENCODER_LAYERNORMS
    assert not after.keys() & {"ReduceMean", "Sqrt", "Sub"}
    eps = [a.f for n in fused.graph.node if n.op_type == "LayerNormalization" for a in n.attribute
           if a.name == "epsilon"]
    assert eps == pytest.approx([1e-5 if exporter == "torchscript" else 1e-6] * ENCODER_LAYERNORMS, rel=1e-6)


@BOTH
def test_gelu_erf_and_tanh_on_encoder(exported, exporter):
    ex = exported("encoder", exporter)
    fused, report = fuse(ex, "gelu", target_opset=20)
    # layer 0 has nn.GELU(), layer 1 nn.GELU(approximate="tanh"), the pooler a hand-written tanh GELU
    assert report.rules.applied == {"gelu_erf": LAYERS // 2, "gelu_tanh": LAYERS // 2 + 1}
    after = ops(fused)
    assert after["Gelu"] == LAYERS + 1 and not after.keys() & {"Erf", "Tanh"}
    tanh = [n for n in fused.graph.node if n.op_type == "Gelu"
            and any(a.name == "approximate" and a.s == b"tanh" for a in n.attribute)]
    assert len(tanh) == LAYERS // 2 + 1


@BOTH
def test_gemm_only_on_2d_matmul(exported, exporter):
    ex = exported("encoder", exporter)
    fused, report = fuse(ex, "gemm")
    assert report.rules.applied == {"matmul_add_gemm": 2}  # the pooler and classifier on the first token
    assert ops(fused)["Gemm"] == 2
    # the 6 Linears of every layer act on [batch, tokens, d]: refused, with the reason
    assert len(re.findall(r"is 3-D, Gemm needs 2-D", reasons(report, "matmul_add_gemm"))) == 6 * LAYERS


@BOTH
def test_conv_bn_folded_on_resnet(exported, exporter):
    import fusion_models as fm  # torch is there: the fixture skipped otherwise

    ex = exported("resnet", exporter)

    assert ops(ex.model)["BatchNormalization"] == fm.ResNet.CONV_BN
    fused, report = fuse(ex, "conv_bn")
    assert report.rules.applied == {"conv_bn": fm.ResNet.CONV_BN}
    assert "BatchNormalization" not in ops(fused) and ops(fused)["Conv"] == fm.ResNet.CONV_BN
    # new weights are initializers; the old Conv weights and BN parameters are pruned
    names = {t.name for t in fused.graph.initializer}
    assert not any(re.search(r"bn\d?\.|downsample\.1\.|running_", n) for n in names), names
    size = sum(t.ByteSize() for t in fused.graph.initializer)
    assert size < sum(t.ByteSize() for t in ex.model.graph.initializer)
    convs = [n for n in fused.graph.node if n.op_type == "Conv"]
    assert all(len(n.input) == 3 and n.input[1] in names and n.input[2] in names for n in convs)


def _readers(model: onnx.ModelProto, op: str) -> collections.Counter:
    """How many ``op`` nodes read each tensor (that some read)."""
    return collections.Counter(i for n in model.graph.node if n.op_type == op for i in n.input[:1])


@BOTH
def test_qkv_packed_on_bert(exported, exporter):
    """Per layer, the query, key and value Linears of one input become one MatMul + Add and a
    Split; ORT on the packed model agrees with ORT on the export and with torch eager."""
    ex = exported("bert", exporter)
    assert sorted(_readers(ex.model, "MatMul").values()).count(3) == LAYERS  # three MatMuls of one input, per layer
    fused, report = fuse(ex, "qkv")
    assert report.rules.applied == {"qkv_pack": LAYERS}
    before, after = ops(ex.model), ops(fused)
    assert after["MatMul"] == before["MatMul"] - 2 * LAYERS and after["Add"] == before["Add"] - 2 * LAYERS
    assert after["Split"] == before["Split"] + LAYERS
    assert 3 not in _readers(fused, "MatMul").values()
    weights = {t.name: t.dims for t in fused.graph.initializer}
    packed = [n.input[1] for n in fused.graph.node if n.op_type == "MatMul" and n.input[1] in weights
              and weights[n.input[1]] == [16, 48]]
    assert len(packed) == LAYERS
    onnx.checker.check_model(fused, full_check=True)


def test_qkv_has_nothing_to_pack_on_gpt2(exported):
    """GPT-2's attention already projects q, k and v with one Conv1D (c_attn): its export is a
    Gemm of the packed weight and a Split. The fusion finds no three projections and says why."""
    ex = exported("gpt2", "dynamo")
    before = ops(ex.model)
    assert before["Split"] == LAYERS and before["Gemm"] == 4 * LAYERS  # c_attn, c_proj, c_fc, mlp.c_proj
    assert 3 not in _readers(ex.model, "MatMul").values() and 3 not in _readers(ex.model, "Gemm").values()
    fused, report = fuse(ex, "qkv")
    assert not report.rules.applied and ops(fused) == before
    # its only MatMuls are attention's: none has a sibling reading its input
    assert reasons(report, "qkv_pack_matmul").count("pattern output 2 (MatMul(x, wk)): no other MatMul reads") == \
        before["MatMul"]


def test_identity_removed_on_both_exports(exported):
    ts = exported("encoder", "torchscript")
    # TorchScript shares the equal LayerNorm parameters of a fresh model through Identity
    fused, report = fuse(ts, "identity")
    assert report.rules.applied == {"identity": 2 * (ENCODER_LAYERNORMS - 1)}
    raw = exported("encoder", "dynamo-unoptimized")
    assert ops(raw.model)["Identity"] == LAYERS  # torch.export's clone before each attention reshape
    fused, report = fuse(raw, "identity")
    assert report.rules.applied == {"identity": LAYERS} and "Identity" not in ops(fused)


def test_transpose_pairs_on_both_exports(exported):
    raw = exported("encoder", "dynamo-unoptimized")
    # k.view(...).transpose(1, 2) then .transpose(-1, -2): one Transpose per layer
    fused, report = fuse(raw, "transpose")
    assert report.rules.applied == {"transpose_merge": LAYERS}
    assert ops(fused)["Transpose"] == ops(raw.model)["Transpose"] - LAYERS
    # TorchScript's own ONNX peephole already merged those pairs: nothing left to do
    ts = exported("encoder", "torchscript")
    fused, report = fuse(ts, "transpose")
    assert not report.rules.applied and ops(fused) == ops(ts.model)


@BOTH
def test_fuse_all_on_encoder(exported, exporter):
    ex = exported("encoder", exporter)
    fused, report = fuse(ex, "all", target_opset=20)
    applied = report.rules.applied
    assert applied["layernorm"] == ENCODER_LAYERNORMS and applied["matmul_add_gemm"] == 2
    assert applied["gelu_erf"] + applied["gelu_tanh"] == LAYERS + 1
    onnx.checker.check_model(fused, full_check=True)


# ---------------------------------------------------------------- refusals (inline models)

def _model(nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _layernorm_model(axes, opset=18, eps=1e-5):
    """
      x -> ReduceMean(axes) -> Sub -> Pow 2 -> ReduceMean(axes) -> Add eps -> Sqrt
           \\________________/   \\__________________ Div _____________________/
                                                        -> Mul scale -> Add bias -> y
    """
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [c("two", 2.0), c("eps", eps), c("scale", np.linspace(0.5, 1.5, 4)), c("bias", np.linspace(-1, 1, 4))]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
    attr_or_input = (lambda i: ([i, "axes"], {})) if opset >= 18 else (lambda i: ([i], {"axes": axes}))
    nodes = [helper.make_node("ReduceMean", attr_or_input("x")[0], ["m"], **attr_or_input("x")[1]),
             helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Pow", ["d", "two"], ["p"]),
             helper.make_node("ReduceMean", attr_or_input("p")[0], ["v"], **attr_or_input("p")[1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"]), helper.make_node("Mul", ["n", "scale"], ["ns"]),
             helper.make_node("Add", ["ns", "bias"], ["y"])]
    return _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])], inits, opset)


def _fuse_inline(model, spec, feeds):
    fused, report = rewrite_model(model, rules=fusions.rule_set(spec), lowering=Lowering.KEEP)
    assert not unused_initializers(fused)
    for got, want in zip(run_ort(fused, feeds), run_ort(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return fused, report


X = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}


@pytest.mark.parametrize("opset", [17, 18])
def test_layernorm_inline_both_axes_forms(opset):
    fused, report = _fuse_inline(_layernorm_model([-1], opset), "layernorm", X)
    assert report.rules.applied == {"layernorm": 1} and ops(fused) == {"LayerNormalization": 1}


def test_layernorm_over_another_axis_is_refused():
    fused, report = _fuse_inline(_layernorm_model([1]), "layernorm", X)
    assert not report.rules.applied and "LayerNormalization" not in ops(fused)
    assert "reduces over axes [1], not the last axis only" in reasons(report, "layernorm")


def test_layernorm_below_opset_17_is_refused():
    fused, report = _fuse_inline(_layernorm_model([-1], opset=16), "layernorm", X)
    assert not report.rules.applied
    assert "needs ai.onnx opset >= 17, the model has 16" in reasons(report, "layernorm")


def _gelu_model(sqrt2=np.sqrt(2.0), opset=20, half_on_x=False, times_inverse=False):
    """x -> Div sqrt2 -> Erf -> Add 1 -> Mul x -> Mul 0.5 -> y
    (half_on_x: y = (x * 0.5) * (1 + erf(x / sqrt2)), as BERT's hand-written gelu;
    times_inverse: x * (1 / sqrt2) instead of x / sqrt2)"""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    scaled = helper.make_node("Mul" if times_inverse else "Div", ["x", "s2"], ["a"])
    if times_inverse:
        sqrt2 = 1.0 / sqrt2
    nodes = [scaled, helper.make_node("Erf", ["a"], ["b"]),
             helper.make_node("Add", ["b", "one"], ["c"])]
    if half_on_x:
        nodes += [helper.make_node("Mul", ["x", "half"], ["d"]), helper.make_node("Mul", ["d", "c"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "c"], ["d"]), helper.make_node("Mul", ["d", "half"], ["y"])]
    return _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])],
                  [c("s2", sqrt2), c("one", 1.0), c("half", 0.5)], opset)


def test_gelu_inline_and_refusals():
    for half_on_x, times_inverse in ((False, False), (True, False), (False, True)):
        fused, report = _fuse_inline(_gelu_model(half_on_x=half_on_x, times_inverse=times_inverse), "gelu", X)
        assert report.rules.applied == {"gelu_erf": 1} and ops(fused) == {"Gelu": 1}
    # another constant than sqrt(2) is not GELU
    fused, report = _fuse_inline(_gelu_model(sqrt2=1.5), "gelu", X)
    assert not report.rules.applied and "Gelu" not in ops(fused) and reasons(report, "gelu_erf")
    # Gelu is opset 20
    fused, report = _fuse_inline(_gelu_model(opset=18), "gelu", X)
    assert not report.rules.applied and "needs ai.onnx opset >= 20, the model has 18" in reasons(report, "gelu_erf")


def _conv_bn_model(var_is_input=False, training_mode=0):
    rng = np.random.default_rng(2)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(4, 3, 3, 3), "w"), numpy_helper.from_array(f(4), "gamma"),
             numpy_helper.from_array(f(4), "beta"), numpy_helper.from_array(f(4), "mean")]
    inputs = [_vi("x", [1, 3, 6, 6])]
    if var_is_input:
        inputs.append(_vi("var", [4]))
    else:
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), "var"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], epsilon=1e-3,
                              training_mode=training_mode)]
    return _model(nodes, inputs, [_vi("y", [1, 4, 6, 6])], inits, opset=15)


def test_conv_bn_inline_and_refusal():
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 6, 6)).astype(np.float32)}
    fused, report = _fuse_inline(_conv_bn_model(), "conv_bn", feeds)
    assert report.rules.applied == {"conv_bn": 1} and ops(fused) == {"Conv": 1}
    assert len(fused.graph.initializer) == 2  # the folded weight and bias; the five old ones pruned
    # statistics that are not constants cannot be folded
    model = _conv_bn_model(var_is_input=True)
    fused, report = rewrite_model(model, rules=fusions.rule_set("conv_bn"), lowering=Lowering.KEEP)
    assert not report.rules.applied and ops(fused)["BatchNormalization"] == 1
    assert "var" in reasons(report, "conv_bn") and "constant" in reasons(report, "conv_bn")


def _matmul_add_model(a_shape, b_shape, c_shape):
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal(b_shape).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(c_shape).astype(np.float32), "c")]
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Add", ["c", "m"], ["y"])]
    return _model(nodes, [_vi("a", a_shape)], [_vi("y", None)], inits)


def test_gemm_inline_and_refusals():
    a = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    fused, report = _fuse_inline(_matmul_add_model([3, 4], [4, 5], [5]), "gemm", {"a": a})
    assert report.rules.applied == {"matmul_add_gemm": 1} and ops(fused) == {"Gemm": 1}
    # a 3-D A: MatMul broadcasts over the batch, Gemm cannot
    fused, report = _fuse_inline(_matmul_add_model([2, 3, 4], [4, 5], [5]), "gemm", {"a": a[None].repeat(2, 0)})
    assert not report.rules.applied and "'a' is 3-D, Gemm needs 2-D" in reasons(report, "matmul_add_gemm")
    # a bias that does not broadcast to [M, N] = [1, 5] (the Add makes the result [3, 5])
    fused, report = _fuse_inline(_matmul_add_model([1, 4], [4, 5], [3, 5]), "gemm", {"a": a[:1]})
    assert not report.rules.applied and "does not broadcast to [1, 5]" in reasons(report, "matmul_add_gemm")


def _qkv_model(bias=True, opset=18, v_bias_shape=None, k_weight_fed=False):
    """x [2, 3, 4] -> MatMul w{q,k,v} (4x4, 4x4, 4x2) [-> Add(b, .)] -> q, k, v (graph outputs)."""
    rng = np.random.default_rng(6)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inputs, inits, nodes = [_vi("x", [2, 3, 4])], [], []
    for b, width in zip("qkv", (4, 4, 2)):
        if k_weight_fed and b == "k":
            inputs.append(_vi("wk", [4, width]))
        else:
            inits.append(numpy_helper.from_array(f(4, width), f"w{b}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w{b}"], [f"{b}_mm" if bias else b]))
        if bias:
            shape = v_bias_shape if v_bias_shape and b == "v" else [width]
            inits.append(numpy_helper.from_array(f(*shape), f"b{b}"))
            nodes.append(helper.make_node("Add", [f"b{b}", f"{b}_mm"], [b]))
    return _model(nodes, inputs, [_vi(b, None) for b in "qkv"], inits, opset)


def test_qkv_inline_forms_and_refusals():
    x = {"x": np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)}
    fused, report = _fuse_inline(_qkv_model(), "qkv", x)
    assert report.rules.applied == {"qkv_pack": 1} and ops(fused) == {"MatMul": 1, "Add": 1, "Split": 1}
    assert [o.name for o in fused.graph.output] == ["q", "k", "v"]
    fused, report = _fuse_inline(_qkv_model(bias=False), "qkv", x)
    assert report.rules.applied == {"qkv_pack_matmul": 1} and ops(fused) == {"MatMul": 1, "Split": 1}
    # below opset 13 Split's sizes are an attribute
    fused, report = _fuse_inline(_qkv_model(opset=11), "qkv", x)
    split = next(n for n in fused.graph.node if n.op_type == "Split")
    assert report.rules.applied == {"qkv_pack": 1} and len(split.input) == 1
    assert [list(a.ints) for a in split.attribute if a.name == "split"] == [[4, 4, 2]]
    # a weight that is fed cannot be packed
    model = _qkv_model(k_weight_fed=True)
    fused, report = rewrite_model(model, rules=fusions.rule_set("qkv"), lowering=Lowering.KEEP)
    assert not report.rules.applied and ops(fused) == ops(model)
    assert "weight 'wk' is not a constant" in reasons(report, "qkv_pack")
    # a bias of another shape: qkv_pack refuses, qkv_pack_matmul packs the MatMuls alone, the Adds stay
    model = _qkv_model(v_bias_shape=[1, 2])
    with_bias = fusions.get("qkv").rules[0]
    _, report = rewrite_model(model, rules=[with_bias], lowering=Lowering.KEEP)
    assert reasons(report, "qkv_pack").splitlines() == 3 * [  # each Add an anchor (the nodes are unnamed)
        "node 'Add': a bias is float32 of shape [1, 2], packing needs float32 of shape [2] (its MatMul's columns)"]
    fused, report = _fuse_inline(model, "qkv", x)
    assert report.rules.applied == {"qkv_pack_matmul": 1} and ops(fused) == {"MatMul": 1, "Split": 1, "Add": 3}


def _transpose_model(first, second, extra_consumer=False):
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=first),
             helper.make_node("Transpose", ["t"], ["y"], perm=second), helper.make_node("Relu", ["y"], ["z"])]
    outputs = [_vi("z", None)]
    if extra_consumer:
        nodes.append(helper.make_node("Neg", ["t"], ["n"]))
        outputs.append(_vi("n", None))
    return _model(nodes, [_vi("x", [2, 3, 4])], outputs)


def test_transpose_inline_cancel_merge_and_refusal():
    fused, report = _fuse_inline(_transpose_model([1, 2, 0], [2, 0, 1]), "transpose", X)
    assert report.rules.applied == {"transpose_cancel": 1} and ops(fused) == {"Relu": 1}
    assert list(fused.graph.node[0].input) == ["x"]
    fused, report = _fuse_inline(_transpose_model([1, 0, 2], [0, 2, 1]), "transpose", X)
    assert report.rules.applied == {"transpose_merge": 1} and ops(fused) == {"Transpose": 1, "Relu": 1}
    # the first Transpose's output is used elsewhere: nothing is swallowed
    fused, report = _fuse_inline(_transpose_model([1, 2, 0], [2, 0, 1], extra_consumer=True), "transpose", X)
    assert not report.rules.applied and "other consumers" in reasons(report, "transpose_cancel")


@given(st.data())
@settings(max_examples=30, derandomize=True, deadline=None, database=None)
def test_transpose_pairs_any_permutations(data):
    """Any two permutations of rank 1-5 (perm omitted = reversed): the fused model computes
    the same, with no Transpose left when they cancel and one otherwise."""
    rank = data.draw(st.integers(1, 5))
    perms = [data.draw(st.one_of(st.none(), st.permutations(range(rank)))) for _ in range(2)]
    attrs = [{} if p is None else {"perm": list(p)} for p in perms]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], **attrs[0]),
             helper.make_node("Transpose", ["t"], ["y"], **attrs[1]), helper.make_node("Relu", ["y"], ["z"])]
    shape = [2, 3, 4, 5, 6][:rank]
    model = _model(nodes, [_vi("x", shape)], [_vi("z", None)])
    x = {"x": np.random.default_rng(rank).standard_normal(shape).astype(np.float32)}
    fused, report = _fuse_inline(model, "transpose", x)
    full = [list(p) if p is not None else list(range(rank))[::-1] for p in perms]
    cancels = [full[0][a] for a in full[1]] == list(range(rank))
    assert report.rules.applied == ({"transpose_cancel": 1} if cancels else {"transpose_merge": 1})
    assert ops(fused)["Transpose"] == (0 if cancels else 1)


def test_identity_to_graph_output_keeps_the_name():
    """
      x -> Relu -> r -> Identity -> i -> Identity -> y (graph output)
      x -> Identity -> z (graph output: a graph input straight to an output stays)
    """
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Identity", ["i"], ["y"]), helper.make_node("Identity", ["x"], ["z"])]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4]), _vi("z", [2, 3, 4])])
    fused, report = _fuse_inline(model, "identity", X)
    assert [o.name for o in fused.graph.output] == ["y", "z"]
    assert [(n.op_type, list(n.input), list(n.output)) for n in fused.graph.node] == [
        ("Relu", ["x"], ["y"]), ("Identity", ["x"], ["z"])]
    assert report.rules.applied == {"identity": 1, "identity_output": 1}
    assert "'z' is a graph output" in reasons(report, "identity")


# ---------------------------------------------------------------- API and CLI

def test_library_api():
    assert fusions.names() == ["identity", "transpose", "conv_bn", "layernorm", "gelu", "qkv", "gemm"]
    assert fusions.get("LayerNorm").min_opset == 17 and fusions.get("gelu").min_opset == 20
    assert [r.name for r in fusions.rule_set("gelu,layernorm")] == ["layernorm", "gelu_erf", "gelu_tanh"]
    assert len(fusions.rule_set("all")) == sum(len(f.rules) for f in fusions.LIBRARY)
    with pytest.raises(UsageError, match="unknown fusion 'layernrom'; the fusions are: identity, transpose"):
        fusions.get("layernrom")


def test_cli_help_lists_every_fusion_and_unknown_is_a_usage_error(tmp_path):
    from graphkit.cli._args import FUSE_HELP

    for name in fusions.names():
        assert re.search(rf"\b{name} \(", FUSE_HELP), name
    proc = run_cli("rewrite", "--help", check_rc=0)
    assert "--fuse" in proc.stdout and "layernorm" in proc.stdout
    model = tmp_path / "m.onnx"
    onnx.save(_gelu_model(), model)
    proc = run_cli("rewrite", model, tmp_path / "out.onnx", "--fuse", "gelu,bogus", check_rc=2)
    assert "unknown fusion 'bogus'; the fusions are: identity, transpose, conv_bn, layernorm, gelu, qkv, gemm" \
        in proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_cli_fuse_chooses_the_fusions_in_rewrite_and_simplify_alike(tmp_path):
    """--fuse is one option (graphkit/cli/_args.py): the fusions applied, in `simplify`'s fuse
    pass and in `rewrite --simplify`'s (it once chose rewrite's rules only, simplify's pass
    then applying its default set: gemm here whatever --fuse said)."""
    model = _matmul_add_model([3, 4], [4, 5], [5])
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    a = {"a": np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)}
    (want,) = run_ort(model, a)
    for command, extra in [("simplify", []), ("rewrite", ["--simplify"])]:
        for fuse, expected in [([], {"Gemm": 1}), (["--fuse", "identity"], {"MatMul": 1, "Add": 1}),
                               (["--fuse", "gemm"], {"Gemm": 1})]:
            dst = tmp_path / f"{command}{len(fuse)}{''.join(fuse)}.onnx"
            run_cli(command, src, dst, *extra, *fuse, check_rc=0)
            out = onnx.load(dst)
            assert ops(out) == expected, (command, fuse)
            np.testing.assert_allclose(run_ort(out, a)[0], want, rtol=1e-5, atol=1e-5)


def test_cli_fuse_all_on_exported_encoder(exported, tmp_path):
    ex = exported("encoder", "torchscript")
    src, dst = tmp_path / "enc.onnx", tmp_path / "enc.fused.onnx"
    onnx.save(ex.model, src)
    proc = run_cli("rewrite", src, dst, "--fuse", "all", "--target-opset", "20", check_rc=0)
    assert f"rule layernorm: x{ENCODER_LAYERNORMS}" in proc.stdout
    fused = onnx.load(dst)
    assert ops(fused)["LayerNormalization"] == ENCODER_LAYERNORMS and ops(fused)["Gelu"] == LAYERS + 1
    for got, want in zip(run_ort(fused, ex.feeds), ex.expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_readme_fusions_example_runs(tmp_path):
    """docs/rules.md's Fusions section: its Python block as a script, then its commands."""
    import shlex
    import subprocess
    import sys

    from doc_pages import DOCS, section as page_section

    section = page_section(DOCS / "rules.md", "## Fusions")
    script = tmp_path / "example.py"
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [ln.split("# prints: ", 1)[1] for ln in code.splitlines()
                                         if ln.startswith("# prints: ")]
    commands = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    outputs = [run_cli(*shlex.split(line.split("#")[0])[1:], cwd=tmp_path, check_rc=0).stdout
               for line in commands.splitlines() if line.strip()]
    assert "needs ai.onnx opset >= 20, the model has 18" in outputs[0]
    assert "rule gelu_erf: x1" in outputs[1]
    assert [n.op_type for n in onnx.load(tmp_path / "gelu.fused.onnx").graph.node] == ["Gelu"]
