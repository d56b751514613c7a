"""LayerNorm and GELU fusions on a 24-layer BERT-like encoder: graphkit vs onnxscript.

The encoder (tests/fusion_models.py: hand-written BERT LayerNorm, nn.GELU() and
nn.GELU(approximate="tanh") in alternate layers, a hand-written tanh GELU in the pooler)
is exported by torch.export at opset 18 and converted to opset 20 (Gelu) before any timing.
Each contender then fuses the same file in this process, file to file (load, fuse, save);
the time is the process's CPU time, the least of --repeat runs:

- graphkit: ``rewrite_model(model, rules=fusions.rule_set(...), lowering=Lowering.KEEP)``
  (``check=False``, as onnxscript checks nothing; the checked time is printed too);
- onnxscript 0.7: its own LayerNorm rules (rewriter.rules.fusion._layer_norm: LayerNorm
  then LayerNorm + bias) and its GELU patterns (ort_fusions.gelu tanh form, erfgelu erf
  forms) rewritten to ai.onnx Gelu, plus the hand-written tanh form of the encoder's pooler
  (0.5 * x first), which its library lacks, in its pattern language; one RewriteRuleSet
  with commute=True.

Prints the times, the ratio and the number of fused nodes each produced, and checks both
results against the original in ONNX Runtime.

    python bench/fusions.py [--layers 24] [--repeat 7]
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the architectures the tests export

FUSED_OP = {"layernorm": "LayerNormalization", "gelu": "Gelu"}


def export_encoder(path: Path, layers: int) -> dict:
    import torch

    import fusion_models as fm

    model = fm.randomize(fm.Encoder(layers=layers, d=64, heads=4, vocab=100, max_len=32, norm="manual"))
    ids = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), str(path), dynamo=True, opset_version=18)
    converted = onnx.version_converter.convert_version(onnx.load(str(path)), 20)
    onnx.save(converted, str(path))
    return {converted.graph.input[0].name: ids.numpy()}


def graphkit_fuse(which: str, check: bool):
    from graphkit.modelio import load_model, save_model
    from graphkit.ops import default_registry
    from graphkit.rewrite import Lowering, fusions, rewrite_model

    rules = fusions.rule_set(which)
    registry = default_registry()  # made once, as onnxscript's rule set is

    def run(src: Path, dst: Path) -> None:
        out, _ = rewrite_model(load_model(str(src)), registry=registry, rules=rules, lowering=Lowering.KEEP,
                               check=check)
        save_model(out, str(dst), input_path=str(src))

    return run


def onnxscript_fuse(which: str):
    import onnx_ir as ir
    from onnxscript.rewriter import pattern
    from onnxscript.rewriter.ort_fusions import erfgelu, gelu
    from onnxscript.rewriter.rules.fusion import _layer_norm

    def to_gelu(op, x):
        return op.Gelu(x)

    def gelu_new(op, x):  # the hand-written (GPT-2) form, which onnxscript's library lacks
        inner = op.Mul(math.sqrt(2.0 / math.pi), op.Add(x, op.Mul(0.044715, op.Pow(x, 3.0))))
        return op.Mul(op.Mul(0.5, x), op.Add(1.0, op.Tanh(inner)))

    def to_gelu_tanh(op, x):
        return op.Gelu(x, approximate="tanh")

    rules = []
    if "layernorm" in which:
        rules += _layer_norm.layer_normalization_rules
    if "gelu" in which:
        rules += [pattern.RewriteRule(gelu.GeluTanhFusion().pattern, to_gelu_tanh, name="GeluTanh"),
                  pattern.RewriteRule(gelu_new, to_gelu_tanh, name="GeluNew"),
                  pattern.RewriteRule(erfgelu.erf_gelu_pattern_1, to_gelu, name="GeluErf1"),
                  pattern.RewriteRule(erfgelu.erf_gelu_pattern_2, to_gelu, name="GeluErf2")]
    rule_set = pattern.RewriteRuleSet(rules, commute=True)

    def run(src: Path, dst: Path) -> None:
        model = ir.load(str(src))
        rule_set.apply_to_model(model)
        ir.save(model, str(dst))

    return run


def timed(fn, src: Path, dst: Path, repeat: int) -> float:
    """CPU seconds of this process, the least of ``repeat`` runs: both contenders run on one
    thread here, and on a shared machine wall time mostly measures the neighbours."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn(src, dst)
        times.append(time.process_time() - start)
    return min(times)


def counts(path: Path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def ort_outputs(path: Path, feeds: dict) -> list:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # not the warnings about initializers a fusion left unused
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "encoder.onnx"
        feeds = export_encoder(src, args.layers)
        before = counts(src)
        reference = ort_outputs(src, feeds)
        print(f"encoder: {args.layers} layers, {sum(before.values())} nodes, opset 20; "
              f"{before['Sqrt']} LayerNorms and {before['Erf'] + before['Tanh']} GELUs written out")
        print(f"{'fusion':<16} {'graphkit':>10} {'+check':>10} {'onnxscript':>11} {'ratio':>7}  fused (gk / os)")
        for which in ("layernorm", "gelu", "layernorm,gelu"):
            gk_dst, os_dst = Path(tmp) / "gk.onnx", Path(tmp) / "os.onnx"
            t_gk = timed(graphkit_fuse(which, check=False), src, gk_dst, args.repeat)
            t_gk_checked = timed(graphkit_fuse(which, check=True), src, gk_dst, args.repeat)
            t_os = timed(onnxscript_fuse(which), src, os_dst, args.repeat)
            found_gk, found_os = counts(gk_dst), counts(os_dst)
            kinds = [FUSED_OP[w] for w in which.split(",")]
            n_gk = sum(found_gk[k] for k in kinds)
            n_os = sum(found_os[k] for k in kinds)
            for path in (gk_dst, os_dst):
                for got, want in zip(ort_outputs(path, feeds), reference):
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            print(f"{which:<16} {t_gk * 1e3:>8.1f}ms {t_gk_checked * 1e3:>8.1f}ms {t_os * 1e3:>9.1f}ms "
                  f"{t_os / t_gk:>6.1f}x  {n_gk} / {n_os}{'' if n_gk == n_os else '  (DIFFERENT COUNTS)'}")
        print("ratio = onnxscript time / graphkit time (CPU time, file to file, least of "
              f"{args.repeat}); both results match the original in ONNX Runtime")


if __name__ == "__main__":
    main()
