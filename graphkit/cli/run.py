"""graphkit run MODEL: run in ONNX Runtime with the kernels the model needs registered."""

from __future__ import annotations

import argparse
import json

from graphkit.cli._args import (add_feed_arguments, add_json_argument, add_output_argument, load_npz, parse_dims,
                               save_npz)
from graphkit.cli._lowering import add_lowering_arguments, parse_prefer

__all__ = ["add_arguments", "describe_json", "load_npz", "run", "save_npz"]  # load_npz, save_npz: graphkit.cli._args'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model to run")
    add_feed_arguments(p)
    add_output_argument(p, metavar="Y.npz", help="write the outputs here (numpy .npz, atomically). "
                                                 "For example -o y.npz")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")
    add_lowering_arguments(p, in_memory=True)
    add_json_argument(p, what="the outputs' names, dtypes, shapes and summary statistics "
                              "(not the arrays: use --output for those)")


def _stats(value) -> dict | None:
    """min, max, mean and NaN/Inf counts of a numeric array (None for other values)."""
    import numpy as np

    if not isinstance(value, np.ndarray) or not value.size or value.dtype.kind not in "fiub":
        return None
    with np.errstate(all="ignore"):  # NaN/Inf flow through: they are results, not errors
        v = value.astype(np.int64) if value.dtype.kind == "b" else value
        out = {"min": v.min().item(), "max": v.max().item(), "mean": float(v.mean(dtype=np.float64))}
        if value.dtype.kind == "f":
            out["nan"] = int(np.isnan(value).sum())
            out["inf"] = int(np.isinf(value).sum())
    # JSON has no NaN/Infinity: such values are written as strings
    return {k: (x if not isinstance(x, float) or np.isfinite(x) else str(x)) for k, x in out.items()}


def describe_json(name: str, value) -> dict:
    import numpy as np

    if not isinstance(value, np.ndarray):
        return {"name": name, "type": type(value).__name__,
                "length": len(value) if hasattr(value, "__len__") else None}
    return {"name": name, "type": "tensor", "dtype": str(value.dtype), "shape": list(value.shape),
            "stats": _stats(value)}


def _describe(name: str, value) -> str:
    import numpy as np

    if not isinstance(value, np.ndarray):
        size = f" of {len(value)}" if hasattr(value, "__len__") else ""
        return f"{name}: {type(value).__name__}{size}"
    stats = ""
    if value.size and value.dtype.kind in "fiu":
        with np.errstate(all="ignore"):  # NaN/Inf flow through: they are results, not errors
            stats = (f" min {value.min():.6g} max {value.max():.6g} "
                     f"mean {value.mean(dtype=np.float64):.6g}")
    return f"{name}: {value.dtype} {list(value.shape)}{stats}"


def run(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from graphkit.cli._args import op_registry
    from graphkit.modelio import check_output_path
    from graphkit.runtime import open_session

    registry = op_registry(args)
    if args.output:
        check_output_path(args.output, args.model,
                          inputs=((args.inputs, "--inputs file"),) if args.inputs else ())
        _refuse_weights_as_output(args.output, args.model)
    options = ort.SessionOptions()
    # graphkit reports every ONNX Runtime failure itself, in one line: keep ORT's log quiet.
    options.log_severity_level = 4
    model, lowering = _lowered(args, registry, options)
    session = open_session(model, registry=registry, threads=args.threads, options=options,
                           unknown_domains=False)
    feeds = (load_npz(args.inputs) if args.inputs
             else session.random_feeds(seed=args.seed, dims=parse_dims(args.dim)))
    outputs = session.run(feeds)
    if args.json:
        print(json.dumps({"model": args.model, "lowering": lowering,
                          "inputs": "given" if args.inputs else {"random": True, "seed": args.seed},
                          "outputs": [describe_json(n, v) for n, v in outputs.items()]}, indent=2))
    else:
        for name, value in outputs.items():
            print(_describe(name, value))
    if args.output:
        save_npz(args.output, outputs)
    return 0


def _lowered(args: argparse.Namespace, registry, options):
    """(what to open, the lowering applied in memory or None): with --bind or --prefer, the
    model with its placeholders lowered (its external weights stay beside the file)."""
    if not args.bind and not args.prefer:
        return args.model, None
    import os

    from graphkit.modelio import load_model
    from graphkit.rewrite import Lowering, rewrite_model

    lowering = Lowering(args.bind) if args.bind else parse_prefer(args.prefer)
    model, _ = rewrite_model(load_model(args.model), registry=registry, lowering=lowering, check=False,
                             path=args.model)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     os.path.dirname(os.path.abspath(args.model)))
    return model, args.bind or ",".join(x.value for x in lowering)


def _refuse_weights_as_output(output: str, model_path: str) -> None:
    from graphkit.external_data import check_external_data, external_tensors
    from graphkit.modelio import check_output_path, load_model

    model = load_model(model_path)
    if external_tensors(model):
        files = check_external_data(model, model_path)
        check_output_path(output, model_path, inputs=tuple(
            (f, f"external data file '{loc}' of the model") for loc, f in files.items()))
