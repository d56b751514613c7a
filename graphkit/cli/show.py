"""graphkit show: pictures of a model, or of what a rewrite changed (graphkit.pictures)."""

from __future__ import annotations

import argparse
import os

from graphkit.cli._args import add_json_argument, add_output_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the ONNX model (before the rewrite, when AFTER is given)")
    p.add_argument("after", nargs="?", help="the rewritten model: draw only what changed")
    add_output_argument(p, metavar="DIR", required=True,
                        help="folder for index.html / graph.html and the SVG files (created if missing). "
                             "For example -o pictures/")
    add_json_argument(p, what="the files written")


def check_target(out_dir: str) -> None:
    """Fail before any work when the pictures cannot be drawn: graphviz missing, a bad or
    unwritable folder."""
    from pathlib import Path

    from graphkit.errors import OutputError
    from graphkit.pictures import dot_program
    from graphkit.publish import unwritable_dir_error

    dot_program()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputError("the pictures folder is a file", path=out_dir, hint="name a folder")
    if not out.parent.is_dir() and str(out.parent):
        raise OutputError("the pictures folder's parent does not exist", path=out_dir,
                          hint=f"create {out.parent} first")
    # Checked now: `rewrite --diff` writes its model before the pictures.
    unwritable = unwritable_dir_error(out if out.is_dir() else (out.parent if str(out.parent) else "."), out_dir,
                                      "pictures folder" if out.is_dir() else "pictures folder's parent")
    if unwritable is not None:
        raise unwritable


def draw_rewrite(out_dir: str, input_path: str, after, report, text: str, *, as_json: bool) -> str:
    """Draw what a rewrite changed (``after``: the rewritten ModelProto or its bytes); returns
    the rewrite's report ``text`` with where the pictures are."""
    import json

    from graphkit.modelio import load_model, parse_model_bytes
    from graphkit.pictures import write_diff

    if isinstance(after, (bytes, bytearray, memoryview)):
        after = parse_model_bytes(bytes(after), input_path)
    lowerings = {op: how for (op, how) in report.actions}
    files = write_diff(load_model(input_path), after, out_dir, lowerings=lowerings,
                       rules=report.rules.applied, before_name=os.path.basename(input_path),
                       after_name="rewritten")
    if as_json:
        return json.dumps({**json.loads(text), "pictures": str(files[0])}, indent=2)
    return f"{text}\n  pictures: {files[0]} (open it in a browser)"


def run(args: argparse.Namespace) -> int:
    import json

    from graphkit.modelio import load_model
    from graphkit.pictures import write_diff, write_graph

    check_target(args.output)
    before = load_model(args.model)
    if args.after is None:
        files = write_graph(before, args.output, name=os.path.basename(args.model))
    else:
        files = write_diff(before, load_model(args.after), args.output,
                           before_name=os.path.basename(args.model),
                           after_name=os.path.basename(args.after))
    if args.json:
        print(json.dumps({"files": [str(f) for f in files]}, indent=2))
    else:
        print(f"wrote {len(files)} files; open {files[0]}")
    return 0
