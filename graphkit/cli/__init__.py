"""The `graphkit` command. Each subcommand lives in its own module, imported on use."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Sequence

from graphkit._invocation import command_line
from graphkit.cli._args import add_ops_arguments
from graphkit.errors import EXIT_INTERNAL, GraphkitError

__all__ = ["main"]

# name -> (module, one-line help); the module provides add_arguments(parser) and run(args).
SUBCOMMANDS = {
    "rewrite": ("graphkit.cli.rewrite", "decompose custom:: nodes or bind them to kernels"),
    "simplify": ("graphkit.cli.simplify", "fold constants and shapes, remove no-ops, dead and duplicate nodes; "
                 "sees through custom ops"),
    "run": ("graphkit.cli.run", "run a model in ONNX Runtime with graphkit's kernels registered"),
    "inspect": ("graphkit.cli.inspect", "show opsets, custom ops with their lowerings, external data"),
    "export": ("graphkit.cli.export", "export a torch model (module:factory) to ONNX with graphkit's ops and gap fillers"),
    "verify": ("graphkit.cli.verify", "run a torch model and its ONNX export on the same inputs and compare"),
    "compare": ("graphkit.cli.compare", "run two ONNX models on the same inputs and compare; --bisect finds the first diverging node"),
    "ops": ("graphkit.cli.ops", "list every known op: its package, signature, attributes and lowerings"),
    "show": ("graphkit.cli.show", "draw a model, or what a rewrite changed (before/after per region), as SVG + HTML"),
    "deploy": ("graphkit.cli.deploy", "write what plain ONNX Runtime needs to run a model without graphkit: its kernel "
               "library, the libraries that links, a manifest, how to load them"),
}

# Subcommands that read or write models, and so need to know the ops in them: each takes
# --ops (added here, once) and reads args.ops.
OPS_COMMANDS = frozenset({"rewrite", "simplify", "run", "inspect", "export", "verify", "compare", "ops", "deploy"})

EPILOG = """exit codes: 0 ok, 2 usage, 3 cannot load model, 4 cannot write output,
5 bad op definition, 6 op without rule or kernel, 7 rewrite failed, 8 model invalid,
9 kernel or session failure, 10 native build failed, 11 export failed,
12 outputs differ beyond tolerance, 13 op package cannot be loaded or conflicts, 14 rule failed, 15 graphviz missing,
70 internal error, 128+N stopped by signal N (130 Ctrl-C, 129 SIGHUP, 143 SIGTERM)"""


# Examples shown at the end of every subcommand's --help (before the exit codes).
EXAMPLES = {
    None: ("graphkit rewrite model.onnx model.lowered.onnx",
           "graphkit run model.lowered.onnx --json",
           "graphkit --debug inspect model.onnx",
           "graphkit --version"),
    "rewrite": ("graphkit rewrite model.onnx model.std.onnx                  # decompose into standard ops",
                "graphkit rewrite model.onnx model.native.onnx --bind native  # bind the C++ kernels",
                "graphkit rewrite model.onnx out.onnx --fuse all --target-opset 20 --rules samples/rules/fuse_my_add.py --explain",
                "graphkit rewrite model.onnx model.std.onnx --target-opset 17 --simplify --diff pictures/"),
    "simplify": ("graphkit simplify model.onnx model.sim.onnx",
                 "graphkit simplify model.onnx model.sim.onnx --explain --size-limit 4MiB",
                 "graphkit simplify model.onnx model.sim.onnx --skip fuse,eliminate-common --json"),
    "run": ("graphkit run model.onnx                           # random inputs, seed 0",
            "graphkit run model.onnx --inputs x.npz --output y.npz",
            "graphkit run model.onnx --bind python --dim batch=4 --json"),
    "inspect": ("graphkit inspect model.onnx",
                "graphkit inspect model.onnx --ops ./my_ops.py --json"),
    "export": ("graphkit export model.py:build model.onnx --input x=1x3x8x8 --dynamic x:0=batch --verify",
               "graphkit export model.py:build model.ts.onnx --input x=1x3x8x8 --no-dynamo --target-opset 17",
               "graphkit export model.py:build model.ph.onnx --input x=1x3x8x8 --placeholder asinh"),
    "verify": ("graphkit verify model.py:build model.onnx",
               "graphkit verify model.py:build model.ph.onnx --bind python --atol 1e-4",
               "graphkit verify mypkg.models:build model.onnx --inputs x.npz --json"),
    "compare": ("graphkit compare model.onnx model.std.onnx      # reports model.onnx vs model.std.onnx",
                "graphkit compare model.ph.onnx model.std.onnx --bind python --bisect",
                "graphkit compare a.onnx b.onnx --dim batch=2 --atol 1e-4 --json"),
    "ops": ("graphkit ops",
            "graphkit ops custom::my_add",
            "graphkit ops --ops ./my_ops.py --json"),
    "show": ("graphkit show model.onnx model.std.onnx -o pictures/  # what the rewrite changed",
             "graphkit show model.onnx -o pictures/                  # the whole (small) model"),
    "deploy": ("graphkit deploy model.native.onnx -o deploy/ --copy-model  # kernels + model, for plain onnxruntime",
               "graphkit deploy --package graphkit_ops -o kernels/          # every native op of a package",
               "graphkit deploy model.native.onnx -o deploy/ --ops acme_ops --march x86-64-v2 --json"),
}


def _examples(*lines: str) -> str:
    """An ``examples:`` block for a parser's epilog."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


class _VersionAction(argparse.Action):
    """--version: graphkit's version, its dependencies' and the kernels already built."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version_text())
        parser.exit(0)


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--debug, -q, -v and --version: accepted before and after the subcommand. On the
    subcommands' parsers they default to SUPPRESS, so they never undo what was given before."""
    default = {} if top else {"default": argparse.SUPPRESS}
    g = parser.add_argument_group("global options (anywhere on the command line)")
    g.add_argument("--debug", action="store_true", help="show the full traceback on errors (and Python warnings)",
                   **default)
    loud = g.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="print errors only", **default)
    loud.add_argument("-v", "--verbose", action="count",
                      help="more detail: Python warnings and the command's wall time on stderr",
                      **({"default": 0} if top else default))
    g.add_argument("--version", action=_VersionAction,
                   help="show the versions of graphkit and its dependencies and the kernels built so far")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphkit", description="Deploy PyTorch models with custom ops: rewrite ONNX graphs, run them in ONNX Runtime.",
                                     epilog=_examples(*EXAMPLES[None]) + "\n\n" + EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(_module=module)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        if name in OPS_COMMANDS:
            add_ops_arguments(p)
        _add_global_options(p, top=False)
        # examples last but one: the exit codes stay the last lines of every --help
        head = p.epilog[: -len(EPILOG)] if p.epilog and p.epilog.endswith(EPILOG) else (p.epilog or "")
        p.epilog = head + _examples(*EXAMPLES[name]) + "\n\n" + EPILOG
    return parser


def _version() -> str:
    from graphkit import __version__

    return __version__


# Distributions --version reports (read from their metadata: nothing is imported).
VERSION_OF = ("onnx", "onnxruntime", "onnxruntime-extensions", "torch")


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _built_kernels() -> dict[str, list[str]]:
    """What graphkit's build cache holds (graphkit.build_cache's layout), without building or
    importing anything: ``native`` lists each native kernel library as its packages, ``torch``
    each torch extension as NAME (PACKAGE). Artefacts without their record are left out."""
    import json

    from graphkit.build_cache import cache_root  # stdlib only: --version stays light

    root = cache_root()
    native, torch_ext = [], []
    with contextlib.suppress(OSError):
        for entry in sorted((root / "native" / "lib").iterdir()):
            lib, record = entry / "libgraphkit_ops.so", entry / "libgraphkit_ops.so.record"
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                fields = json.loads(record.read_text())
                if lib.stat().st_size == fields["size"]:
                    native.append(f"{', '.join(fields.get('packages') or ['?'])} ({entry})")
    with contextlib.suppress(OSError):
        for entry in sorted((root / "torch_ext").iterdir()):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                fields = json.loads((entry / "graphkit-build.json").read_text())
                if (entry / fields["library"]).stat().st_size == fields.get("size", (entry / fields["library"]).stat().st_size):
                    torch_ext.append(f"{fields['name']} ({fields.get('package', '?')}, {entry})")
    return {"root": str(root), "native": native, "torch": torch_ext}


def _version_text() -> str:
    lines = [f"graphkit {_version()}", f"python {sys.version.split()[0]}"]
    lines += [f"{name} {_dist_version(name)}" for name in VERSION_OF]
    built = _built_kernels()
    lines.append(f"build cache: {built['root']}")
    lines.append("native kernel libraries built: " + (str(len(built["native"])) if built["native"] else "none"))
    lines += [f"  {item}" for item in built["native"]]
    lines.append("torch extensions built: " + (str(len(built["torch"])) if built["torch"] else "none"))
    lines += [f"  {item}" for item in built["torch"]]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """Errors are one stderr line: messages quoted from ONNX or ONNX Runtime may hold newlines."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _malformed_model(args: argparse.Namespace) -> GraphkitError | None:
    """After an unexpected exception: a ModelLoadError if the command's model holds a name
    that is not UTF-8 text (protobuf hands such strings over as bytes), else None.

    Runs only on the failure path, so well-formed models pay nothing for it.
    """
    path = getattr(args, "input", None) or getattr(args, "model", None)
    if not path:
        return None
    try:
        from graphkit.errors import ModelLoadError
        from graphkit.modelio import load_model

        model = load_model(path)
        stack = [(model, "ModelProto")]
        while stack:
            msg, where = stack.pop()
            for fd, value in msg.ListFields():
                repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
                values = value if repeated else [value]
                if fd.message_type is not None:
                    stack.extend((v, f"{where}.{fd.name}") for v in values)
                elif fd.type == fd.TYPE_STRING:
                    bad = next((v for v in values if isinstance(v, bytes)), None)
                    if bad is not None:
                        return ModelLoadError(f"{where}.{fd.name} {bad[:60]!r} is not valid UTF-8 text",
                                              path=str(path), hint="re-export the model; ONNX names are UTF-8")
    except Exception:  # noqa: BLE001 - a diagnosis must never hide the original error
        return None
    return None


class _Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread like KeyboardInterrupt is for SIGINT, so
    every ``finally`` runs: temporaries are removed and nothing partial is published."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise_terminated(signum, frame):  # noqa: ARG001 - a signal handler's signature
    raise _Terminated(signum)


@contextlib.contextmanager
def _terminate_as_exception():
    """SIGTERM and SIGHUP raise _Terminated while the command runs (main thread only)."""
    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                old[sig] = signal.signal(sig, _raise_terminated)
            except (ValueError, OSError):  # not the main thread, or no such signal here
                pass
        yield
    finally:
        for sig, handler in old.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    with _terminate_as_exception():
        try:
            parser = _parser()
            args = parser.parse_args(argv)
            if not getattr(args, "_module", None):
                parser.print_help()
                return 2
            return _main(args)
        except _Terminated as exc:  # arrived while an error was being reported
            return _terminated(exc)
        except KeyboardInterrupt:
            print("graphkit: interrupted", file=sys.stderr)
            return 130


def _terminated(exc: _Terminated) -> int:
    print(f"graphkit: interrupted by {signal.Signals(exc.signum).name}", file=sys.stderr)
    return 128 + exc.signum


def _main(args: argparse.Namespace) -> int:
    loud = bool(args.debug or args.verbose)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            if not loud:  # errors are one line: a Python warning (a kernel's NaN) must not add to them
                warnings.simplefilter("ignore")
            # --ops reach every registry the command builds (a factory's TorchOps() too),
            # and hints speak the command's language, for this block only.
            with _quiet(args.quiet), command_line(getattr(args, "ops", None) or ()):
                code = importlib.import_module(args._module).run(args) or 0
        if args.verbose:
            print(f"graphkit: {args.command} took {time.perf_counter() - start:.2f} s", file=sys.stderr)
        return code
    except _Terminated as exc:
        return _terminated(exc)
    except GraphkitError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"graphkit: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("graphkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`graphkit inspect m.onnx | head`): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug in graphkit, not a user mistake
        if args.debug:
            traceback.print_exc()
        malformed = _malformed_model(args)
        if malformed is not None:  # graphkit tripped over a model protobuf accepted: say what is wrong
            print(f"graphkit: error: {_one_line(str(malformed))}", file=sys.stderr)
            return malformed.exit_code
        print(f"graphkit: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
              "(rerun with --debug and report it)", file=sys.stderr)
        return EXIT_INTERNAL


@contextlib.contextmanager
def _quiet(on: bool):
    """-q: the command's reports and progress go nowhere; errors are printed after it."""
    if not on:
        yield
        return
    import os

    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        yield


if __name__ == "__main__":
    sys.exit(main())
