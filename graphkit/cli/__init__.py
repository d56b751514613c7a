"""The `graphkit` command. Each subcommand lives in its own module, imported on use."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import traceback
from collections.abc import Sequence

from graphkit.errors import EXIT_INTERNAL, GraphkitError

__all__ = ["OPS_HELP", "add_ops_arguments", "main", "op_registry"]

# name -> (module, one-line help); the module provides add_arguments(parser) and run(args).
SUBCOMMANDS = {
    "rewrite": ("graphkit.cli.rewrite", "decompose custom:: nodes or bind them to kernels"),
    "run": ("graphkit.cli.run", "run a model in ONNX Runtime with graphkit's kernels registered"),
    "inspect": ("graphkit.cli.inspect", "show opsets, custom ops with their lowerings, external data"),
    "export": ("graphkit.cli.export", "export a torch model (module:factory) to ONNX with graphkit's ops and gap fillers"),
    "verify": ("graphkit.cli.verify", "run a torch model and its ONNX export on the same inputs and compare"),
    "compare": ("graphkit.cli.compare", "run two ONNX models on the same inputs and compare; --bisect finds the first diverging node"),
    "ops": ("graphkit.cli.ops", "list every known op: its package, signature, attributes and lowerings"),
}

# Subcommands that read or write models, and so need to know the ops in them: each takes
# --ops (added here, once) and reads args.ops.
OPS_COMMANDS = frozenset({"rewrite", "run", "inspect", "export", "verify", "compare", "ops"})

# Spelled out here rather than imported from graphkit.ops (which imports onnx): `--help`
# stays fast. tests/test_cli_ops.py checks they agree with graphkit.ops.
OPS_HELP = ("an op package to load besides graphkit's own ops, installed packages (entry points "
            "of group 'graphkit.ops') and those listed in $GRAPHKIT_OPS (comma-separated): "
            "MODULE, MODULE:ATTR, FILE.py or FILE.py:ATTR, where ATTR (default PACKAGE) is an "
            "OpPackage or a function returning one; repeatable. For example --ops acme_ops "
            "or --ops ./my_ops.py:PACKAGE")

EPILOG = """exit codes: 0 ok, 2 usage, 3 cannot load model, 4 cannot write output,
5 bad op definition, 6 op without rule or kernel, 7 rewrite failed, 8 model invalid,
9 kernel or session failure, 10 native build failed, 11 export failed,
12 outputs differ beyond tolerance, 13 op package cannot be loaded or conflicts,
70 internal error, 128+N stopped by signal N (130 Ctrl-C, 129 SIGHUP, 143 SIGTERM)"""


def add_ops_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The shared "op packages" group (--ops), for every command that reads or writes models."""
    group = parser.add_argument_group(
        "op packages", "Where the definitions of a model's custom ops come from; "
        "`graphkit ops` lists the known ops.")
    group.add_argument("--ops", action="append", default=[], metavar="PACKAGE", help=OPS_HELP)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphkit", description="Deploy PyTorch models with custom ops: rewrite ONNX graphs, run them in ONNX Runtime.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"graphkit {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", help="show the full traceback on errors")
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
        if name in OPS_COMMANDS:
            add_ops_arguments(p)
    return parser


def _version() -> str:
    from graphkit import __version__

    return __version__


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


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread like KeyboardInterrupt is for SIGINT, so
    every ``finally`` runs: temporaries are removed and nothing partial is published."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise_terminated(signum, frame):  # noqa: ARG001 - a signal handler's signature
    raise Terminated(signum)


@contextlib.contextmanager
def _terminate_as_exception():
    """SIGTERM and SIGHUP raise Terminated while the command runs (main thread only)."""
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
        except Terminated as exc:  # arrived while an error was being reported
            return _terminated(exc)
        except KeyboardInterrupt:
            print("graphkit: interrupted", file=sys.stderr)
            return 130


def _terminated(exc: Terminated) -> int:
    print(f"graphkit: interrupted by {signal.Signals(exc.signum).name}", file=sys.stderr)
    return 128 + exc.signum


def _main(args: argparse.Namespace) -> int:
    try:
        return importlib.import_module(args._module).run(args) or 0
    except Terminated as exc:
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


if __name__ == "__main__":
    sys.exit(main())
