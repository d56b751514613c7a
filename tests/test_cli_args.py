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


@pytest.mark.parametrize("command", ["rewrite", "simplify"])
def test_fuse_is_one_option_in_both_commands(command):
    from graphkit.cli import _parser
    from graphkit.cli._args import chosen_fusions

    args = _parser().parse_args([command, *ARGV[command], "--fuse", "gelu,layernorm"])
    assert [f.name for f in chosen_fusions(args)] == ["layernorm", "gelu"]  # library order
    assert chosen_fusions(_parser().parse_args([command, *ARGV[command]])) is None  # the command's default


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


# --------------------------------------------------------------------------- where output goes

# Every command that writes a file names it with -o/--output; rewrite, simplify and export also
# take their model's path as the last positional argument (OUT.onnx), as they always did.
WRITERS = ("rewrite", "simplify", "export", "run", "show", "deploy")
MODEL_WRITERS = {"rewrite": ["in.onnx"], "simplify": ["in.onnx"], "export": ["m.py:build", "--input", "x=1"]}


@pytest.mark.parametrize("command", WRITERS)
def test_every_command_writing_a_file_takes_o_and_output(command):
    options = _subparsers()[command]._option_string_actions
    assert options["-o"] is options["--output"]
    assert options["-o"].dest == "output" and options["-o"].graphkit_group == "output"


@pytest.mark.parametrize("command", sorted(MODEL_WRITERS))
@pytest.mark.parametrize("spelling", [["-o"], ["--output"], ["--output="]])
def test_the_model_written_is_the_positional_or_o(command, spelling):
    from graphkit.cli import _parser

    parser = _parser()
    positional = parser.parse_args([command, *MODEL_WRITERS[command][:1], "out.onnx", *MODEL_WRITERS[command][1:]])
    words = ([spelling[0] + "out.onnx"] if spelling == ["--output="] else [*spelling, "out.onnx"])
    before = parser.parse_args([command, *words, *MODEL_WRITERS[command]])  # the option first or last
    after = parser.parse_args([command, *MODEL_WRITERS[command], *words])
    assert vars(before) == vars(after) == vars(positional)
    assert positional.output == "out.onnx"


@pytest.mark.parametrize("command", sorted(MODEL_WRITERS))
@pytest.mark.parametrize("extra", [[], ["out.onnx", "-o", "other.onnx"]], ids=["neither", "both"])
def test_the_model_written_is_named_exactly_once(command, extra, capsys):
    from graphkit.cli import main

    rest = MODEL_WRITERS[command]
    argv = [command, rest[0], *extra, *rest[1:]]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert ("is required" in err) if not extra else ("not allowed with" in err)
    assert "OUT.onnx" in err


def test_rewrite_with_o_writes_what_the_positional_writes(tmp_path):
    """The model written through -o runs and gives 2a + b, then Relu, like the positional one."""
    import numpy as np
    import onnx

    from conftest import my_add_model, run_cli
    from graphkit.runtime import open_session

    model = tmp_path / "m.onnx"
    onnx.save(my_add_model(), model)
    run_cli("rewrite", model, tmp_path / "positional.onnx", check_rc=0)
    run_cli("rewrite", model, "-o", tmp_path / "option.onnx", check_rc=0)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal((4, 3)).astype(np.float32)}
    want = np.maximum(2 * feeds["a"] + feeds["b"], 0)
    for name in ("positional.onnx", "option.onnx"):
        (z,) = open_session(str(tmp_path / name)).run(feeds).values()
        np.testing.assert_allclose(z, want, rtol=1e-6, atol=1e-6)
    assert (tmp_path / "positional.onnx").read_bytes() == (tmp_path / "option.onnx").read_bytes()
