"""Pictures of what a rewrite changed: one before/after drawing per rewritten region.

A *region* is a connected group of changed nodes: the nodes of the old graph that are gone
(``before``) and the new nodes that replaced them (``after``), joined through the tensors they
produce. Identical regions (same ops in, same ops out, same lowering) are drawn once, with the
count and the names of every node they cover. Layout is graphviz's ``dot`` (the ``graphviz``
package writes the DOT text; the ``dot`` program renders it); pages are self-contained HTML
with the SVG inline, readable offline.
"""

from __future__ import annotations

import collections
import html
import math
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from graphkit.errors import OutputError, ToolError, UsageError
from graphkit.publish import atomic_write, write_error
from graphkit.rewrite.graph.types import TypeTable

__all__ = ["Region", "diff_regions", "dot_program", "write_diff", "write_graph"]

MAX_DRAWN_NODES = 400   # per drawing: dot takes minutes on thousands of nodes
MAX_REGIONS = 50        # distinct regions drawn; the index counts the rest
_NAMES_LISTED = 12


@dataclass
class Region:
    """A connected group of removed (``before``) and added (``after``) nodes of one graph."""

    before: list[onnx.NodeProto]
    after: list[onnx.NodeProto]
    how: str = ""                      # the lowering or rules that produced it, when known
    count: int = 1                     # identical regions folded into this one
    names: list[str] = field(default_factory=list)  # before-nodes of all folded regions ("#5 Op" if unnamed)

    @property
    def title(self) -> str:
        """"ops before -> ops after", as the pages head the region."""
        return f"{_ops(self.before) or '(nothing)'} -> {_ops(self.after) or '(removed)'}"

    def kind(self) -> tuple:
        """What makes two regions identical (and drawn once): their ops and lowering."""
        return (tuple(sorted(_op(n) for n in self.before)), tuple(sorted(_op(n) for n in self.after)),
                self.how)


def _op(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _ops(nodes: Sequence[onnx.NodeProto]) -> str:
    counts = collections.Counter(_op(n) for n in nodes)
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in counts.items())


def _signature(node: onnx.NodeProto) -> tuple:
    return (node.domain, node.op_type, tuple(node.input), tuple(node.output),
            tuple(a.SerializeToString(deterministic=True) for a in node.attribute))


def _unmatched(nodes: Iterable[onnx.NodeProto], others: Iterable[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes of ``nodes`` with no identical node left in ``others`` (as multisets)."""
    left = collections.Counter(_signature(n) for n in others)
    out = []
    for node in nodes:
        sig = _signature(node)
        if left[sig]:
            left[sig] -= 1
        else:
            out.append(node)
    return out


def diff_regions(before: onnx.GraphProto, after: onnx.GraphProto, *,
                 lowerings: Mapping[str, str] | None = None, rules: Iterable[str] = ()) -> list[Region]:
    """The regions in which ``after`` differs from ``before`` (main graphs, not subgraph bodies).

    ``lowerings`` maps an op (``domain::name``) to how the rewrite lowered it, ``rules`` names
    the rules that applied; both only label the regions. Identical regions are folded.
    """
    removed, added = _unmatched(before.node, after.node), _unmatched(after.node, before.node)

    # Nodes without inputs (Constants) are shared by many regions: they join none, and are
    # drawn in every region that reads them.
    changed = [(side, n) for side, nodes in (("b", removed), ("a", added)) for n in nodes if any(n.input)]
    leaves = [(side, n) for side, nodes in (("b", removed), ("a", added)) for n in nodes if not any(n.input)]
    parent = list(range(len(changed)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Join nodes through the tensors changed nodes produce: a side's consumers to its producers,
    # and a removed node to the added node producing the same name (decompositions keep names).
    producer: dict[tuple[str, str], int] = {}
    by_name: dict[str, int] = {}
    for i, (side, node) in enumerate(changed):
        for out in node.output:
            if out:
                producer[(side, out)] = i
                if out in by_name:
                    parent[find(i)] = find(by_name[out])
                else:
                    by_name[out] = i
    for i, (side, node) in enumerate(changed):
        for name in node.input:
            j = producer.get((side, name))
            if j is not None:
                parent[find(i)] = find(j)

    groups: dict[int, Region] = {}
    for i, (side, node) in enumerate(changed):
        region = groups.setdefault(find(i), Region([], []))
        (region.before if side == "b" else region.after).append(node)
    readers: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    for i, (side, node) in enumerate(changed):
        for name in node.input:
            readers[(side, name)].add(find(i))
    for side, node in leaves:
        roots = set().union(*(readers.get((side, out), set()) for out in node.output)) or {("leaf", id(node))}
        for root in roots:
            region = groups.setdefault(root, Region([], []))
            (region.before if side == "b" else region.after).insert(0, node)

    position = {id(n): i for i, n in enumerate(before.node)}  # names unnamed nodes
    lowerings = dict(lowerings or {})
    rules = sorted(set(rules))
    folded: dict[tuple, Region] = {}
    for region in groups.values():
        hows = sorted({lowerings[_op(n)] for n in region.before if _op(n) in lowerings})
        region.how = ", ".join(hows) or (f"rules: {', '.join(rules)}" if rules else "")
        region.names = [n.name or f"#{position[id(n)]} {_op(n)}" for n in region.before]
        same = folded.get(region.kind())
        if same is None:
            folded[region.kind()] = region
        else:
            same.count += 1
            same.names.extend(region.names)
    return list(folded.values())


# ----------------------------------------------------------------------------- drawing


def dot_program() -> str:
    """The path of graphviz's ``dot``; ToolError naming how to install it otherwise."""
    found = shutil.which("dot")
    if found is None:
        raise ToolError(
            "drawing needs graphviz's 'dot' program, which is not on PATH",
            hint="install graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install "
                 "graphviz; conda: conda install graphviz)")
    return found


def _dtype_name(elem_type: int) -> str:
    """numpy's name for an ONNX element type; "?" for UNDEFINED or a code onnx does not know."""
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "?"
    except (KeyError, ValueError, TypeError):
        return "?"


def _types(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor name -> "float32[2,3]" for every value whose type is known or inferable."""
    out: dict[str, str] = {}
    for name, tp in TypeTable.inferred(model).items():
        t = tp.tensor_type
        dims = ",".join(d.dim_param or str(d.dim_value) if (d.dim_param or d.HasField("dim_value")) else "?"
                        for d in t.shape.dim) if t.HasField("shape") else "..."
        out[name] = f"{_dtype_name(t.elem_type)}[{dims}]"
    return out


def _attr_text(attr: onnx.AttributeProto) -> str:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto) and not value.external_data and \
            math.prod(value.dims) <= 4:
        from onnx import numpy_helper

        value = numpy_helper.to_array(value).tolist()
    elif isinstance(value, bytes):
        value = value.decode(errors="replace")
    elif isinstance(value, (onnx.TensorProto, onnx.GraphProto)) or (
            isinstance(value, list) and value and not isinstance(value[0], (int, float, bytes))):
        value = f"<{type(value).__name__}>"
    text = f"{attr.name}={value}"
    return text if len(text) <= 40 else text[:37] + "..."


def _dot_source(nodes: Sequence[onnx.NodeProto], types: Mapping[str, str], title: str,
                initializers: frozenset[str] = frozenset()) -> str:
    import graphviz

    g = graphviz.Digraph(graph_attr={"rankdir": "TB", "label": title, "labelloc": "t",
                                     "fontname": "Helvetica", "fontsize": "12"},
                         node_attr={"fontname": "Helvetica", "fontsize": "10"},
                         edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    produced = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    consumed = {name for n in nodes for name in n.input if name}
    for i, node in enumerate(nodes):
        lines = [f"<b>{html.escape(_op(node))}</b>"]
        if node.name:
            lines.append(html.escape(node.name))
        lines.extend(html.escape(_attr_text(a)) for a in node.attribute[:4])
        g.node(f"n{i}", "<" + "<br/>".join(lines) + ">", shape="box", style="rounded,filled",
               fillcolor="#e8f0fe" if node.domain in ("", "ai.onnx") else "#fde8e8")
    tensors: dict[str, str] = {}

    def tensor(name: str, kind: str) -> str:
        if name not in tensors:
            tensors[name] = f"t{len(tensors)}"
            label = f"{name}\n{types.get(name, '')}".strip()
            g.node(tensors[name], label, shape="note" if name in initializers else "ellipse",
                   style="filled", fillcolor="#f4f4f4" if kind == "in" else "#e6f4ea")
        return tensors[name]

    for i, node in enumerate(nodes):
        for name in node.input:
            if not name:
                continue
            if name in produced:
                g.edge(f"n{produced[name]}", f"n{i}", label=f"{name}\n{types.get(name, '')}".strip())
            else:
                g.edge(tensor(name, "in"), f"n{i}")
        for name in node.output:
            if name and name not in consumed:
                g.edge(f"n{i}", tensor(name, "out"))
    return g.source


def render_svg(source: str) -> str:
    """SVG text of a DOT graph, rendered by graphviz's ``dot``."""
    dot = dot_program()
    try:
        proc = subprocess.run([dot, "-Tsvg"], input=source.encode(), capture_output=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        raise ToolError("graphviz's dot took over 300 s to lay out a drawing",
                            hint="draw fewer nodes") from exc
    if proc.returncode != 0:
        raise ToolError(f"graphviz's dot failed: {proc.stderr.decode(errors='replace').strip()[:300]}",
                            hint="check the graphviz installation (dot -V)")
    svg = proc.stdout.decode()
    return svg[svg.find("<svg"):]  # the inline form: no XML prolog or doctype


_CSS = """body{font-family:Helvetica,Arial,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em}.pair{display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap}
.side{border:1px solid #ccc;border-radius:6px;padding:.5em}.side h3{margin:.2em 0 .5em;font-size:1em}
.meta{color:#555;font-size:.9em}svg{max-width:100%;height:auto}code{background:#f4f4f4;padding:0 .2em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left}"""


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def _write_text(path: Path, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _prepare_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError("the pictures folder is a file", path=str(out_dir),
                          hint="name a folder (it is created if missing)")
    try:
        out_dir.mkdir(parents=False, exist_ok=True)
    except FileNotFoundError as exc:
        raise OutputError("the pictures folder's parent does not exist", path=str(out_dir),
                          hint=f"create {out_dir.parent} first") from exc
    except OSError as exc:
        raise write_error(exc, out_dir, "cannot create the pictures folder") from exc


def _remove_stale(out_dir: Path, keep: set[str]) -> None:
    for pattern in ("region-*.html", "region-*.svg", "graph.svg", "graph.html"):
        for old in out_dir.glob(pattern):
            if old.name not in keep:
                try:
                    old.unlink(missing_ok=True)
                except OSError as exc:
                    raise write_error(exc, old, "cannot remove a picture of an earlier run") from exc


def write_diff(before: onnx.ModelProto, after: onnx.ModelProto, out_dir: str | os.PathLike[str], *,
               lowerings: Mapping[str, str] | None = None, rules: Iterable[str] = (),
               before_name: str = "before", after_name: str = "after") -> list[Path]:
    """Draw every rewritten region of ``before`` -> ``after`` into ``out_dir``.

    Writes ``index.html`` (the list of regions) and, per region, ``region-NNN.html`` with the
    before and after drawings inline and ``region-NNN-before.svg`` / ``-after.svg``. Each file is
    written atomically; region files of an earlier run in the folder are removed. Returns the
    files written, index first.
    """
    out = Path(out_dir)
    dot_program()
    _prepare_dir(out)
    regions = diff_regions(before.graph, after.graph, lowerings=lowerings, rules=rules)
    types_before, types_after = _types(before), _types(after)
    inits_before = frozenset(i.name for i in before.graph.initializer)
    inits_after = frozenset(i.name for i in after.graph.initializer)
    written: list[Path] = []
    rows = []
    for k, region in enumerate(regions[:MAX_REGIONS], 1):
        stem = f"region-{k:03d}"
        sides = []
        for side, nodes, types, inits, model_name in (
                ("before", region.before, types_before, inits_before, before_name),
                ("after", region.after, types_after, inits_after, after_name)):
            shown = nodes[:MAX_DRAWN_NODES]
            note = f" (first {MAX_DRAWN_NODES} of {len(nodes)} nodes)" if len(nodes) > len(shown) else ""
            svg = render_svg(_dot_source(shown, types, f"{side}: {model_name}{note}", inits))
            path = out / f"{stem}-{side}.svg"
            _write_text(path, svg if svg.lstrip().startswith("<?xml") else
                        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + svg)
            written.append(path)
            sides.append(f'<div class="side"><h3>{side}: {html.escape(_ops(nodes) or "nothing")}'
                         f'{html.escape(note)}</h3>{svg}</div>')
        names = ", ".join(html.escape(n) for n in region.names[:_NAMES_LISTED])
        more = f", ... ({len(region.names) - _NAMES_LISTED} more)" if len(region.names) > _NAMES_LISTED else ""
        meta = (f'<p class="meta">{region.count} region{"s" if region.count != 1 else ""}'
                f'{" like this" if region.count != 1 else ""}; by: <code>{html.escape(region.how or "?")}</code>'
                f'<br/>nodes: {names}{more}</p>')
        page = out / f"{stem}.html"
        _write_text(page, _page(region.title, f'<p><a href="index.html">all regions</a></p>'
                                f"<h1>{html.escape(region.title)}</h1>{meta}"
                                f'<div class="pair">{"".join(sides)}</div>'))
        written.append(page)
        rows.append(f'<tr><td><a href="{stem}.html">{html.escape(region.title)}</a></td>'
                    f"<td>{region.count}</td><td><code>{html.escape(region.how or '?')}</code></td>"
                    f"<td>{names}{more}</td></tr>")
    skipped = len(regions) - min(len(regions), MAX_REGIONS)
    summary = (f"<p>{html.escape(before_name)} -> {html.escape(after_name)}: {sum(r.count for r in regions)} rewritten "
               f"region(s) of {len(regions)} kind(s)"
               + (f"; {skipped} kind(s) beyond the first {MAX_REGIONS} are not drawn" if skipped else "")
               + ".</p>")
    table = ("<table><tr><th>region</th><th>count</th><th>by</th><th>nodes</th></tr>"
             + "".join(rows) + "</table>") if rows else "<p>Nothing changed.</p>"
    index = out / "index.html"
    _write_text(index, _page(f"graphkit: {before_name} -> {after_name}",
                             f"<h1>What the rewrite changed</h1>{summary}{table}"))
    _remove_stale(out, {p.name for p in written})
    return [index, *written]


def write_graph(model: onnx.ModelProto, out_dir: str | os.PathLike[str], *, name: str = "model") -> list[Path]:
    """Draw a whole (small) model's main graph: ``graph.svg`` and ``graph.html`` in ``out_dir``."""
    nodes = list(model.graph.node)
    if len(nodes) > MAX_DRAWN_NODES:
        raise UsageError(f"{name} has {len(nodes)} nodes; graphkit draws at most {MAX_DRAWN_NODES}",
                            path=name, hint="draw what a rewrite changed instead: "
                                            "graphkit show BEFORE.onnx AFTER.onnx -o DIR")
    out = Path(out_dir)
    dot_program()
    _prepare_dir(out)
    svg = render_svg(_dot_source(nodes, _types(model), name,
                                 frozenset(i.name for i in model.graph.initializer)))
    svg_path, page = out / "graph.svg", out / "graph.html"
    _write_text(svg_path, '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + svg)
    _write_text(page, _page(name, f"<h1>{html.escape(name)}</h1><p class=\"meta\">{html.escape(_ops(nodes))}</p>{svg}"))
    return [page, svg_path]
