"""The CLI's shared argument groups (issue 28, item 3): every option more than one command
takes is declared once, in graphkit.cli._args (or _lowering, through its declare()); the
older spellings parse to the same dest as the one word --help shows."""

from __future__ import annotations

import ast
import pathlib

import pytest

import graphkit.cli

CLI = pathlib.Path(graphkit.cli.__file__).parent
ARGV = {"rewrite": ["in.onnx", "out.onnx"], "simplify": ["in.onnx", "out.onnx"], "run": ["m.onnx"],
        "inspect": ["m.onnx"], "export": ["m.py:build", "out.onnx", "--input", "x=1"],
        "verify": ["m.py:build", "m.onnx"], "compare": ["a.onnx", "b.onnx"], "ops": [],
        "show": ["m.onnx", "-o", "d"], "deploy": ["m.onnx", "-o", "d"]}


def _subparsers():
    import argparse

    from graphkit.cli import _parser

    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_every_shared_option_comes_from_the_shared_groups():
    from graphkit.cli._args import SHARED_OPTIONS

    seen = set()
    for command, parser in _subparsers().items():
        for string, action in parser._option_string_actions.items():
            if string in SHARED_OPTIONS:
                assert getattr(action, "graphkit_group", None) == SHARED_OPTIONS[string], (command, string)
                seen.add(string)
    assert seen == set(SHARED_OPTIONS)


def test_shared_options_are_spelled_in_no_command_module():
    """No add_argument("--seed", ...) outside _args.py and _lowering.py: one declaration each."""
    from graphkit.cli._args import SHARED_OPTIONS

    for path in CLI.glob("*.py"):
        if path.name in ("_args.py", "_lowering.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                strings = {a.value for a in node.args if isinstance(a, ast.Constant)}
                assert not strings & set(SHARED_OPTIONS), (path.name, strings)


def test_no_command_module_imports_another_commands_private_names():
    commands = {name for name in graphkit.cli.SUBCOMMANDS}
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("graphkit.cli."):
                if node.module.rpartition(".")[2] in commands:
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    assert not private, (path.name, node.module, private)


@pytest.mark.parametrize(("command", "old", "new", "value", "dest"), [
    ("export", "--opset", "--target-opset", "17", "target_opset"),
    ("rewrite", "--opset", "--target-opset", "17", "target_opset"),
    ("show", "--out", "--output", "pics", "output"),
    ("deploy", "--out", "--output", "dep", "output"),
    ("run", "--output", "-o", "y.npz", "output"),
])
def test_aliases_parse_to_the_same_dest(command, old, new, value, dest):
    from graphkit.cli import _parser

    rest = [w for w in ARGV[command] if w not in ("-o", "d")] if command in ("show", "deploy") else ARGV[command]
    parser = _parser()
    a = parser.parse_args([command, *rest, old, value])
    b = parser.parse_args([command, *rest, new, value])
    typed = int(value) if dest == "target_opset" else value
    assert getattr(a, dest) == getattr(b, dest) == typed
    assert vars(a) == vars(b)


@pytest.mark.parametrize(("command", "hidden", "shown"), [("export", "--opset", "--target-opset N"),
                                                          ("show", "--out", "-o DIR, --output DIR"),
                                                          ("deploy", "--out", "-o DIR, --output DIR")])
def test_help_shows_the_one_word_and_names_the_old(command, hidden, shown):
    text = _subparsers()[command].format_help()
    assert shown in text
    assert f"{hidden} " not in text.replace(f"({hidden}, the older spelling", "")
    assert f"({hidden}, the older spelling, is accepted too)" in " ".join(text.split())


def test_defaults_unchanged():
    from graphkit.cli import _parser

    parser = _parser()
    export = parser.parse_args(["export", *ARGV["export"]])
    assert (export.target_opset, export.seed, export.atol, export.rtol, export.bind) == (18, 0, 1e-5, 1e-5, None)
    rewrite = parser.parse_args(["rewrite", *ARGV["rewrite"]])
    assert rewrite.target_opset is None and rewrite.bind is None and rewrite.prefer is None
    for command in ("run", "verify", "compare"):
        args = parser.parse_args([command, *ARGV[command]])
        assert (args.inputs, args.seed, args.dim, args.json) == (None, 0, [], False), command


def test_parse_helpers():
    import argparse

    from graphkit.cli._args import comparison_options, parse_dims
    from graphkit.errors import UsageError

    assert parse_dims(["batch=4", "seq=7"]) == {"batch": 4, "seq": 7}
    with pytest.raises(UsageError, match="NAME=SIZE"):
        parse_dims(["batch"])
    ns = argparse.Namespace(inputs=None, seed=3, dim=["n=2"], atol=0.1, rtol=0.0, bind="python")
    assert comparison_options(ns) == {"inputs": None, "seed": 3, "dims": {"n": 2}, "atol": 0.1, "rtol": 0.0,
                                      "bind": "python"}
    with pytest.raises(UsageError, match="non-negative"):
        comparison_options(argparse.Namespace(**{**vars(ns), "atol": float("nan")}))


@pytest.mark.parametrize("spelling", ["-o", "--output"])
def test_run_writes_its_outputs_with_either_spelling(tmp_path, spelling):
    import numpy as np
    import onnx

    from conftest import my_add_model, run_cli

    model = tmp_path / "m.onnx"
    onnx.save(my_add_model(), model)
    run_cli("run", model, "--seed", "1", spelling, tmp_path / "y.npz", "--bind", "python", check_rc=0)
    with np.load(tmp_path / "y.npz") as y:
        assert y["z"].shape == (1, 3)
