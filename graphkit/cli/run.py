"""graphkit run MODEL: run in ONNX Runtime with the kernels the model needs registered."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model to run")
    p.add_argument("--inputs", metavar="X.npz",
                   help="input arrays by input name (numpy .npz); random inputs with --seed if omitted")
    p.add_argument("--output", metavar="Y.npz", help="write the outputs here (numpy .npz, atomically)")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic input dimension for random inputs; for example "
                        "--dim batch=4 (default 1)")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")


def _parse_dims(items: list[str]) -> dict[str, int]:
    from graphkit.errors import UsageError

    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit():
            raise UsageError(f"--dim {item!r} is not NAME=SIZE", hint="for example --dim batch=4")
        dims[name] = int(value)
    return dims


def load_npz(path: str) -> dict:
    import zipfile

    import numpy as np

    from graphkit.errors import UsageError

    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError as exc:
        raise UsageError("no such file", path=path, hint="check the --inputs path") from exc
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UsageError(f"not a readable .npz file: {exc}", path=path,
                         hint="save inputs with numpy.savez(path, name=array)") from exc


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from graphkit.modelio import atomic_write, check_output_path
    from graphkit.runtime import open_session

    if args.output:
        check_output_path(args.output, args.model)
    session = open_session(args.model, threads=args.threads)
    feeds = (load_npz(args.inputs) if args.inputs
             else session.random_feeds(seed=args.seed, dims=_parse_dims(args.dim)))
    outputs = session.run(feeds)
    for name, value in outputs.items():
        arr = np.asarray(value)
        stats = (f" min {arr.min():.6g} max {arr.max():.6g} mean {arr.mean(dtype=np.float64):.6g}"
                 if arr.size and arr.dtype.kind in "fiu" else "")
        print(f"{name}: {arr.dtype} {list(arr.shape)}{stats}")
    if args.output:
        with atomic_write(args.output) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **outputs)
    return 0
