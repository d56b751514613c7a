"""The options several commands take, each declared once here, as Polygraphy's argument groups
are: a command subscribes to the groups it needs and reads them back with their parse helper.

    feeds        --inputs, --seed, --dim        add_feed_arguments / feeds, parse_dims, load_npz
    tolerances   --atol, --rtol                 add_tolerance_arguments / tolerances
    target opset --target-opset (--opset)       add_target_opset_argument
    output       -o/--output (--out), --json    add_output_argument, add_json_argument / save_npz
    output model OUT.onnx or -o/--output        add_output_model_argument (rewrite, simplify, export)
    lowering     --bind, --prefer               graphkit.cli._lowering (it declares them with declare())
    model output --explain, --no-check, --full-check, --external-data, --dry-run, --diff, --json,
                 --progress (rewrite, simplify)  add_model_output_arguments
    op packages  --ops (every command reading or writing models)  add_ops_arguments / op_registry
    fusions      --fuse (rewrite, simplify)     add_fuse_argument / chosen_fusions

One word per concept: the opset a command targets is --target-opset and where output goes is
-o/--output, on every command that writes a file; rewrite, simplify and export also take
their model's path as the last positional argument (OUT.onnx), as they always did. The older
spellings (export --opset, --out) still parse, to the same dest, without a line of their own
in --help (the option's help names them).

Every action added here carries ``graphkit_group`` (its group's name): tests/test_cli_args.py
checks that every subcommand's shared options come from here.

Nothing here imports onnx, numpy or torch at module level: `--help` stays fast."""

from __future__ import annotations

import argparse

__all__ = ["FUSE_HELP", "OPS_HELP", "SHARED_OPTIONS", "add_feed_arguments", "add_fuse_argument", "add_json_argument",
           "add_model_output_arguments", "add_ops_arguments", "add_output_argument", "add_output_model_argument",
           "add_target_opset_argument", "add_tolerance_arguments", "chosen_fusions", "comparison_options", "declare",
           "feeds", "load_npz", "op_registry", "parse_dims", "save_npz", "tolerances"]

# option string -> its group: the options only this module (and _lowering, through declare) adds.
SHARED_OPTIONS = {"--inputs": "feeds", "--seed": "feeds", "--dim": "feeds",
                  "--atol": "tolerances", "--rtol": "tolerances",
                  "--target-opset": "target opset", "--opset": "target opset",
                  "-o": "output", "--output": "output", "--out": "output", "--json": "output",
                  "--bind": "lowering", "--prefer": "lowering", "--ops": "op packages", "--fuse": "fusions"}

def declare(container, group: str, *strings: str, aliases: tuple[str, ...] = (), **kwargs) -> argparse.Action:
    """``container.add_argument(*strings, **kwargs)``, marked as group ``group``'s. Each of
    ``aliases`` (an older spelling) is the same action under another option string, so it
    parses to the same dest and satisfies ``required``, but --help shows ``strings`` only; the
    option's help says the alias is accepted."""
    if aliases:
        also = ", ".join(aliases)
        kwargs["help"] = f"{kwargs.get('help', '')} ({also}, the older spelling, is accepted too)".lstrip()
    action = container.add_argument(*strings, **kwargs)
    action.graphkit_group = group
    for alias in aliases:
        # argparse has no public hidden alias: register the action under one more string
        # (what add_argument does, without listing it in option_strings, which --help prints).
        container._check_conflict(argparse.Action([alias], dest=action.dest))
        container._option_string_actions[alias] = action
    return action


# --------------------------------------------------------------------------- feeds


def add_feed_arguments(p: argparse.ArgumentParser, *, inputs: bool = True, dims: bool = True,
                       random: str = "random inputs") -> argparse._ArgumentGroup:
    """--inputs X.npz, --seed N and --dim NAME=SIZE: the values a model runs on. ``inputs`` and
    ``dims`` off: --seed alone (export makes its example inputs from --input shapes)."""
    g = p.add_argument_group("inputs", "The values the model runs on: an .npz file, or random "
                             "values from a seed.")
    if inputs:
        declare(g, "feeds", "--inputs", metavar="X.npz",
                help="input arrays by ONNX input name (numpy .npz, as numpy.savez(path, x=array) writes); "
                     "random inputs with --seed if omitted. For example --inputs x.npz")
    declare(g, "feeds", "--seed", type=int, default=0, metavar="N",
            help=f"seed for the {random} (default 0). For example --seed 3")
    if dims:
        declare(g, "feeds", "--dim", action="append", default=[], metavar="NAME=SIZE",
                help="size of a symbolic input dimension for random inputs (default 1); repeatable. "
                     "For example --dim batch=4")
    return g


def parse_dims(items: list[str]) -> dict[str, int]:
    """--dim's NAME=SIZE items as {name: size}; UsageError for anything else."""
    from graphkit.errors import UsageError

    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit():
            raise UsageError(f"--dim {item!r} is not NAME=SIZE", hint="for example --dim batch=4")
        dims[name] = int(value)
    return dims


def load_npz(path: str) -> dict:
    """The arrays of an .npz file by name (never unpickled); UsageError if it cannot be read."""
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


def feeds(args: argparse.Namespace) -> dict:
    """The feeds group parsed: {"inputs": arrays from --inputs or None, "seed", "dims"}."""
    inputs = getattr(args, "inputs", None)
    return {"inputs": load_npz(inputs) if inputs else None, "seed": args.seed,
            "dims": parse_dims(getattr(args, "dim", None) or [])}


# --------------------------------------------------------------------------- tolerances


def add_tolerance_arguments(p: argparse.ArgumentParser, *, when: str = "") -> argparse._ArgumentGroup:
    """--atol and --rtol (``when``: a condition to say first, such as "with --verify: ")."""
    g = p.add_argument_group("tolerances", "When two outputs agree.")
    declare(g, "tolerances", "--atol", type=float, default=1e-5, metavar="X",
            help=f"{when}absolute tolerance (default 1e-5). For example --atol 1e-4")
    declare(g, "tolerances", "--rtol", type=float, default=1e-5, metavar="X",
            help=f"{when}relative tolerance (default 1e-5): an element passes when "
                 "|actual - expected| <= atol + rtol * |expected|. For example --rtol 1e-3")
    return g


def tolerances(args: argparse.Namespace) -> dict:
    """{"atol", "rtol"} from the tolerances group; UsageError unless both are >= 0."""
    from graphkit.errors import UsageError

    for name in ("atol", "rtol"):
        value = getattr(args, name)
        if not value >= 0:  # also rejects NaN
            raise UsageError(f"--{name} {value} must be a non-negative number", hint=f"for example --{name} 1e-4")
    return {"atol": args.atol, "rtol": args.rtol}


# --------------------------------------------------------------------------- target opset


def add_target_opset_argument(p, *, help: str, default: int | None = None) -> argparse.Action:
    """--target-opset N (dest target_opset): the ai.onnx opset the command's result uses.
    --opset, export's older spelling, is accepted too."""
    return declare(p, "target opset", "--target-opset", type=int, default=default, metavar="N",
                   aliases=("--opset",), help=f"{help}. For example --target-opset 17")


# --------------------------------------------------------------------------- output


def add_output_argument(p, *, metavar: str, help: str, required: bool = False) -> argparse.Action:
    """-o/--output (dest output): where a command writes what it makes (run's arrays, show's
    pictures, deploy's folder). --out, the older spelling, is accepted."""
    return declare(p, "output", "-o", "--output", metavar=metavar, required=required, aliases=("--out",),
                   help=help)


def add_output_model_argument(p, *, help: str) -> None:
    """The model a command writes (rewrite, simplify, export; dest output): its last positional
    argument, OUT.onnx, as always, or -o/--output OUT.onnx as every other command names its
    output. Exactly one of the two is required."""
    g = p.add_mutually_exclusive_group(required=True)
    # SUPPRESS: the positional left empty (OUT given with -o) sets nothing, so it never
    # overwrites the option's value, whichever comes first on the command line.
    g.add_argument("output", nargs="?", metavar="OUT.onnx", default=argparse.SUPPRESS, help=help)
    declare(g, "output", "-o", "--output", dest="output", metavar="OUT.onnx", default=argparse.SUPPRESS,
            help="the same as the OUT.onnx argument, as other commands name their output")


def add_json_argument(p, *, what: str = "the report") -> argparse.Action:
    """--json: print ``what`` as JSON instead of text (for scripts)."""
    return declare(p, "output", "--json", action="store_true", help=f"print {what} as JSON")


def save_npz(path: str, arrays: dict) -> None:
    """Write ``arrays`` as a numpy .npz, atomically and without pickle (any array names)."""
    import zipfile

    import numpy as np

    from graphkit.errors import UsageError
    from graphkit.publish import atomic_write

    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise UsageError(f"output '{name}' is a {type(value).__name__}, not a tensor; --output "
                             "stores tensors only", hint="omit --output for this model")
    with atomic_write(path) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, value in arrays.items():
                if value.dtype.kind == "O":  # string tensors: store as unicode, never pickled
                    value = value.astype(str)
                with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                    np.lib.format.write_array(fh, value, allow_pickle=False)


# --------------------------------------------------------------------------- comparisons


def comparison_options(args: argparse.Namespace) -> dict:
    """verify's and compare's keyword arguments from the groups they subscribe to: feeds,
    tolerances and --bind (usage errors first, before any model is loaded)."""
    return {**tolerances(args), **feeds(args), "bind": args.bind}


def add_model_output_arguments(p: argparse.ArgumentParser, *, explain: str, changed: str = "changed") -> None:
    """What a command writing one model from another takes (rewrite, simplify): --explain,
    the check, external weights, --dry-run, --diff pictures, --json and --progress."""
    p.add_argument("--explain", nargs="?", const="summary", choices=("summary", "all"), default=None, help=explain)
    p.add_argument("--no-check", action="store_true",
                   help="skip the ONNX checker and shape inference on the result")
    p.add_argument("--full-check", action="store_true",
                   help="run strict shape inference over the whole result even when it is big")
    p.add_argument("--external-data", choices=("auto", "link", "copy"), default="auto",
                   help="when writing into another directory, make external weights valid there by hard "
                        "link (link), copy (copy) or link falling back to copy (auto, the default)")
    p.add_argument("--dry-run", action="store_true", help="do everything but write the output")
    p.add_argument("--diff", metavar="DIR",
                   help=f"also draw what changed: DIR/index.html and a before/after page per {changed} "
                        "region (needs graphviz's dot)")
    add_json_argument(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show progress on stderr (default: on a terminal, for models over 10k nodes)")


# --------------------------------------------------------------------------- op packages

# Spelled out here rather than imported from graphkit.ops (which imports onnx): `--help`
# stays fast. tests/test_cli_ops.py checks they agree with graphkit.ops.
OPS_HELP = ("an op package to load besides graphkit's own ops, installed packages (entry points "
            "of group 'graphkit.ops') and those listed in $GRAPHKIT_OPS (comma-separated): "
            "MODULE, MODULE:ATTR, FILE.py, FILE.py:ATTR or a package FOLDER (holding __init__.py; "
            "FOLDER:ATTR), where ATTR (default PACKAGE) is an OpPackage or a function returning "
            "one; repeatable. For example --ops acme_ops or --ops ./my_ops.py:PACKAGE")


def add_ops_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "op packages" group (--ops), for every command that reads or writes models."""
    group = parser.add_argument_group(
        "op packages", "Where the definitions of a model's custom ops come from; "
        "`graphkit ops` lists the known ops.")
    declare(group, "op packages", "--ops", action="append", default=[], metavar="PACKAGE", help=OPS_HELP)
    return group


def op_registry(args: argparse.Namespace):
    """The OpRegistry a command works with: built once per command from ``args.ops``.

    An op package that cannot be imported, holds no OpPackage or defines an op another
    package defines too is an OpPackageError (exit 13)."""
    registry = getattr(args, "_registry", None)
    if registry is None:
        from graphkit.ops import discover

        registry = discover(tuple(getattr(args, "ops", None) or ()))
        args._registry = registry
    return registry


# --------------------------------------------------------------------------- fusions

# Spelled out here rather than imported from graphkit.rewrite.fusions (which imports onnx):
# `--help` stays fast. tests/test_fusions.py checks they agree with fusions.LIBRARY.
FUSE_HELP = ("the fusions of graphkit's library to apply (comma-separated, or all): "
             "identity (remove Identity nodes), transpose (cancel inverse Transpose pairs, merge others), "
             "conv_bn (fold BatchNormalization into Conv), layernorm (-> LayerNormalization, opset >= 17), "
             "gelu (erf/tanh forms -> Gelu, opset >= 20), qkv (three MatMul (+ Add) projections of one input "
             "-> one packed MatMul and a Split), gemm (2-D MatMul + Add -> Gemm). "
             "rewrite applies them before lowering (none by default) and, with --simplify, in simplify's "
             "fuse pass; simplify's fuse pass applies every one but qkv by default (its packed MatMul and "
             "Split cost ONNX Runtime 1-5%% on one thread; --skip fuse applies none). "
             "A fusion whose opset the model lacks says so with --explain (rewrite: add --target-opset). "
             "For example --fuse layernorm,gelu --target-opset 20")


def add_fuse_argument(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "fusions" group (--fuse NAME,...|all): which of graphkit's fusions a command applies."""
    group = p.add_argument_group("fusions", "graphkit's fusion library (graphkit.rewrite.fusions).")
    declare(group, "fusions", "--fuse", metavar="NAME,...|all", help=FUSE_HELP)
    return group


def chosen_fusions(args: argparse.Namespace) -> list | None:
    """The Fusion objects --fuse names, in library order; None without --fuse (the command's
    default). An unknown name is a UsageError naming the fusions."""
    spec = getattr(args, "fuse", None)
    if spec is None:
        return None
    from graphkit.rewrite import fusions

    return fusions.LIBRARY.select(spec)
