"""graphkit export MODULE:FACTORY OUT.onnx --input NAME=SHAPE: export a torch model."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

from graphkit.cli._args import (add_feed_arguments, add_json_argument, add_output_model_argument,
                               add_target_opset_argument, add_tolerance_arguments, tolerances)
from graphkit.cli._lowering import add_lowering_arguments
from graphkit.input_specs import InputSpec, parse_dynamic, parse_input

# Nothing here imports torch at module level: `graphkit export` reports usage errors (exit 2)
# and output path errors (exit 4) before it imports torch, which takes seconds.


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="function (or class) called without arguments that returns the torch model: a "
                        "module path or a .py file, for example mypkg.models:build or model.py:build")
    add_output_model_argument(p, help="where to write the model (written atomically)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=SHAPE[:DTYPE]", required=True,
                   help="one per forward argument, in order: ONNX input name, shape, dtype (default "
                        "float32); random values with --seed. For example --input x=1x3x224x224 "
                        "--input ids=2x16:int64")
    p.add_argument("--dynamo", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.export-based exporter (default) or, with --no-dynamo, TorchScript")
    add_target_opset_argument(p, default=18, help=(
        "ai.onnx opset to export to (default 18); below 18 the dynamo exporter converts its opset-18 graph "
        "(graphkit's converter, as rewrite --target-opset), and the export fails if that cannot"))
    p.add_argument("--dynamic", action="append", default=[], metavar="NAME:AXIS=DIM",
                   help="a symbolic dimension; repeat for more, share DIM names between inputs. "
                        "For example --dynamic x:0=batch")
    p.add_argument("--output-name", action="append", default=[], metavar="NAME",
                   help="ONNX output names, in order (default: the exporter's)")
    p.add_argument("--placeholder", action="append", default=[], metavar="OP",
                   help="export the ATen op OP as graphkit's custom::OP placeholder instead of "
                        "standard ops; for example --placeholder asinh")
    p.add_argument("--torch-translation", action="append", default=[], metavar="NS::OP",
                   help="leave another library's torch op that a graphkit op stands for to torch's own "
                        "translation instead of graphkit's placeholder; for example --torch-translation "
                        "torchvision::deform_conv2d (standard DeformConv, needs --target-opset 19 or higher)")
    p.add_argument("--no-gap-fillers", action="store_true",
                   help="do not register graphkit's symbolics for ATen ops the TorchScript "
                        "exporter lacks (python -m graphkit.export.gaps lists them)")
    p.add_argument("--rewrites", action="append", default=[], metavar="MODULE:NAME",
                   help="a RewriteRegistry whose rewrites apply during the export; repeatable. "
                        "For example --rewrites mypkg.deploy:REWRITES")
    p.add_argument("--backend", default="onnxruntime",
                   help="target backend the rewrites' Backend conditions see (default onnxruntime)")
    add_feed_arguments(p, inputs=False, dims=False, random="random example inputs")
    p.add_argument("--verify", action="store_true",
                   help="run torch and the written model in ONNX Runtime on the example inputs and "
                        "compare (exit code 12 on a mismatch; the model stays written)")
    add_tolerance_arguments(p, when="with --verify: ")
    add_lowering_arguments(p, in_memory=True, prefer=False, when="with --verify: ")
    add_json_argument(p)


def _check_source(spec: str, *, what: str, example: str) -> None:
    """The checks of graphkit.export._loading.load_object that need no import: the spec's
    form, a file that exists, a top-level module that can be found."""
    from graphkit.errors import UsageError

    source, sep, attr = spec.rpartition(":")
    if not sep or not source or not attr.isidentifier():
        raise UsageError(f"{what} {spec!r} is not MODULE:NAME or FILE.py:NAME", hint=f"for example {example}")
    if source.endswith(".py") or os.sep in source or Path(source).exists():
        if not Path(source).is_file():
            raise UsageError(f"{what}: no such file", path=source, hint=f"for example {example}")
    elif importlib.util.find_spec(source.partition(".")[0]) is None:
        raise UsageError(f"{what}: no module named {source!r}", path=source,
                         hint="pass a .py file path or an importable module name (check PYTHONPATH)")


def _check_arguments(args: argparse.Namespace) -> tuple[list[InputSpec], dict[str, dict[int, str]]]:
    """Every check of the command line that needs no torch, in the order of the arguments."""
    from graphkit.errors import UsageError
    from graphkit.modelio import check_output_path

    _check_source(args.factory, what="model factory", example="mypkg.models:build")
    specs = [parse_input(text) for text in args.input]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise UsageError(f"--input names repeat: {names}", hint="give every input its own name")
    if args.target_opset < 1:
        raise UsageError(f"--target-opset {args.target_opset}: an opset is a positive number")
    dynamic: dict[str, dict[int, str]] = {}
    for text in args.dynamic:
        name, axis, dim = parse_dynamic(text)
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            raise UsageError(f"--dynamic {text!r} names no --input", hint=f"the inputs are {names}")
        if axis >= len(spec.shape):
            raise UsageError(f"--dynamic {text!r}: input {name} has rank {len(spec.shape)}")
        dynamic.setdefault(name, {})[axis] = dim
    for spec in args.rewrites:
        _check_source(spec, what="rewrites", example="mypkg.deploy:REWRITES")
    tolerances(args)
    if args.bind and not args.verify:
        raise UsageError("--bind chooses the kernels of --verify", hint="add --verify, or drop --bind")
    check_output_path(args.output, None)
    return specs, dynamic


def _report_dict(report) -> dict:
    return {"path": str(report.path), "exporter": report.exporter, "opset": report.opset,
            "ir_version": report.ir_version, "inputs": list(report.inputs),
            "outputs": list(report.outputs),
            "custom_nodes": [{"name": n.name, "op": n.op, "known": n.known} for n in report.custom_nodes],
            "lowerings": {k: list(v) for k, v in report.lowerings.items()},
            "gap_fillers": list(report.gap_fillers), "rewrites": dict(report.rewrites),
            "runtime_check": None if report.runtime_check is None else {
                "checked": report.runtime_check.checked, "stand_ins": report.runtime_check.stand_ins,
                "reason": report.runtime_check.reason, "lowerings": dict(report.runtime_check.lowerings)}}


def run(args: argparse.Namespace) -> int:
    from graphkit.cli._args import op_registry
    from graphkit.errors import UsageError

    specs, dynamic = _check_arguments(args)  # before torch: usage errors come at once
    names = [s.name for s in specs]

    from graphkit.export import RewriteRegistry, export
    from graphkit.export._loading import load_model_factory, load_object, random_inputs, silenced_output
    from graphkit.modelio import check_output_path

    registries = []
    for spec in args.rewrites:
        reg = load_object(spec, what="rewrites", example="mypkg.deploy:REWRITES")
        if not isinstance(reg, RewriteRegistry):
            raise UsageError(f"--rewrites {spec} is a {type(reg).__name__}, not a RewriteRegistry",
                             hint="name a graphkit.export.RewriteRegistry object")
        registries.append(reg)
    check_output_path(args.output, None)
    model = load_model_factory(args.factory)
    # After the factory ran: it may import the model's op packages itself (or make them
    # importable). export() adds the ops the model holds to these.
    registry = op_registry(args)
    inputs = random_inputs(specs, args.seed)
    kwargs = {}
    if args.no_gap_fillers:
        kwargs["gap_fillers"] = None
    with silenced_output(not args.debug):  # torch prints the whole graph when an export fails
        report = export(model, tuple(inputs), args.output, dynamo=args.dynamo, opset=args.target_opset,
                        registry=registry, input_names=names, output_names=args.output_name or None,
                        dynamic_dims=dynamic or None, placeholders=args.placeholder,
                        rewrites=registries, backend=args.backend,
                        torch_translations=args.torch_translation, **kwargs)
    verification = None
    if args.verify:
        from graphkit.verify import verify_export

        verification = verify_export(model, args.output, inputs={n: t.numpy() for n, t in zip(names, inputs)},
                                     atol=args.atol, rtol=args.rtol, bind=args.bind,
                                     registry=report.registry)
    if args.json:
        out = _report_dict(report)
        if verification is not None:
            out["verify"] = verification.to_dict()
        print(json.dumps(out, indent=2))
    else:
        print(report.details())
        if verification is not None:
            print(verification.format())
    if verification is not None:
        verification.raise_for_mismatch()
    return 0
