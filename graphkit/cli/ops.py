"""graphkit ops [NAME ...]: every op graphkit knows, with its package, signature and lowerings."""

from __future__ import annotations

import argparse
import json
from typing import Any

from graphkit.cli._args import add_json_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="show only these ops: a name (my_add) or DOMAIN::NAME (custom::my_add)")
    add_json_argument(p, what="the packages and ops as one document (for scripts)")
    p.epilog = ("The ops come from graphkit's own package, installed packages (entry points of "
                "group 'graphkit.ops'), $GRAPHKIT_OPS and --ops.\n\n" + (p.epilog or ""))


def run(args: argparse.Namespace) -> int:
    from graphkit.cli._args import op_registry

    registry = op_registry(args)
    ops = _select(registry, args.names)
    if args.json:
        print(json.dumps(describe(registry, ops), indent=2))
    else:
        print(format_ops(registry, ops))
    return 0


def _select(registry, names: list[str]) -> list:
    from graphkit.errors import UsageError

    if not names:
        return list(registry)
    out = []
    for name in names:
        op = registry.get(name)
        if op is None:
            known = ", ".join(sorted(o.qualified_name for o in registry)) or "none"
            raise UsageError(f"no op package defines an op named '{name}'",
                             hint=f"the known ops are {known}; pass --ops PACKAGE for others")
        if op not in out:
            out.append(op)
    return out


def native_info(package) -> dict[str, Any] | None:
    """How a package's native kernels come about, JSON-ready (None: it has none)."""
    native = getattr(package, "native", None)
    if native is None:
        return None
    if native.library is not None:
        return {"kind": "prebuilt", "library": str(native.library)}
    return {"kind": "sources", "root": str(native.root), "sources": list(native.sources)}


def _package_dict(package) -> dict[str, Any]:
    return {"name": package.name, "version": package.version, "origin": package.origin,
            "doc": package.doc, "native": native_info(package),
            "ops": [op.qualified_name for op in package.ops]}


def _lowerings(registry, op) -> dict[str, Any]:
    package = registry.package_of(op)
    native = None
    if op.native:
        info = native_info(package)
        native = info if info is not None else {"kind": "missing"}
    return {
        "decompositions": [{"name": d.name, "min_opset": d.min_opset, "max_opset": d.max_opset}
                           for d in op.decompositions],
        "native": native,
        "python": op.python_kernel is not None,
    }


def _attr_dict(a) -> dict[str, Any]:
    from graphkit.ops._opdef import REQUIRED

    return {"name": a.name, "type": a.type.onnx_name, "required": a.default is REQUIRED,
            "default": None if a.default is REQUIRED else a.default, "doc": a.doc}


def op_dict(registry, op) -> dict[str, Any]:
    """One op, JSON-ready: what ``graphkit ops --json`` lists."""
    package = registry.package_of(op)
    return {
        "op": op.qualified_name,
        "name": op.name,
        "domain": op.domain,
        "since_version": op.since_version,
        "package": None if package is None else {"name": package.name, "version": package.version,
                                                 "origin": package.origin},
        "torch_op": f"torch.ops.{op.torch_namespace}.{op.name}",
        "torch_namespace": op.torch_namespace,
        "foreign_torch_ops": [f.name for f in op.foreign_ops],
        "standard_onnx_ops": [{"op": str(std), "since_opset": std.since_opset} for std in op.standard_ops],
        "doc": op.doc,
        "inputs": [{"name": p.name, "type": p.type, "optional": p.optional, "doc": p.doc} for p in op.inputs],
        "outputs": [{"name": p.name, "type": p.type, "optional": p.optional, "doc": p.doc} for p in op.outputs],
        "type_constraints": {k: list(v) for k, v in op.type_constraints.items()},
        "attributes": [_attr_dict(a) for a in op.attributes],
        "lowerings": _lowerings(registry, op),
        "kernel_domains": {"native": registry.kernel_domain(op, "native"),
                           "python": registry.kernel_domain(op, "python")},
    }


def describe(registry, ops=None) -> dict[str, Any]:
    """The JSON document of ``graphkit ops --json``: packages, then ops."""
    ops = list(registry) if ops is None else list(ops)
    return {"packages": [_package_dict(p) for p in registry.packages],
            "ops": [op_dict(registry, op) for op in ops]}


def _opsets(d: dict) -> str:
    if d["max_opset"] is None:
        return f"opset >= {d['min_opset']}"
    return f"opset {d['min_opset']}..{d['max_opset']}"


def _params(params: list[dict]) -> str:
    return ", ".join(f"{p['name']}{'?' if p['optional'] else ''}: {p['type']}" for p in params) or "none"


def _native_text(native: dict) -> str:
    if native["kind"] == "prebuilt":
        return f"native (prebuilt library {native['library']})"
    if native["kind"] == "sources":
        return "native (C++ kernel built from the package's sources)"
    return "native declared, but its package has no NativeKernels (cannot bind)"


def format_ops(registry, ops=None) -> str:
    ops = list(registry) if ops is None else list(ops)
    lines = []
    lines.append(f"{len(ops)} op(s) from {len(registry.packages)} package(s):")
    for p in registry.packages:
        version = f" {p.version}" if p.version else ""
        origin = f" [{p.origin}]" if p.origin else ""
        lines.append(f"  {p.name}{version}{origin}: {', '.join(op.qualified_name for op in p.ops)}"
                     + (f" -- {p.doc}" if p.doc else ""))
        native = native_info(p)
        if native is not None and native["kind"] == "prebuilt":
            lines.append(f"    native kernels: prebuilt library {native['library']}")
        elif native is not None:
            lines.append(f"    native kernels: built from {', '.join(native['sources'])} in {native['root']}")
    dicts = [op_dict(registry, op) for op in ops]
    for d in dicts:
        pkg = d["package"]
        where = "a loose OpDef" if pkg is None else (
            f"{pkg['name']}{' ' + pkg['version'] if pkg['version'] else ''}"
            f"{' [' + pkg['origin'] + ']' if pkg['origin'] else ''}")
        lines.append("")
        lines.append(f"{d['op']}  (package {where})")
        if d["doc"]:
            lines.append(f"  {d['doc'].strip().splitlines()[0]}")
        lines.append(f"  domain {d['domain']}, since_version {d['since_version']}, torch op {d['torch_op']}")
        if d["foreign_torch_ops"]:
            lines.append(f"  also for:   {', '.join(d['foreign_torch_ops'])} (exported as this op)")
        if d.get("standard_onnx_ops"):
            lines.append("  computes:   " + ", ".join(f"{s['op']}-{s['since_opset']}" for s in d["standard_onnx_ops"])
                         + " (rewrite lowers those nodes as this op)")
        lines.append(f"  inputs:     {_params(d['inputs'])}")
        lines.append(f"  outputs:    {_params(d['outputs'])}")
        lines.append("  types:      " + "; ".join(f"{k} in {', '.join(v)}" for k, v in d["type_constraints"].items()))
        attrs = [f"{a['name']}: {a['type']} " + ("(required)" if a["required"] else f"= {a['default']!r}")
                 for a in d["attributes"]]
        lines.append(f"  attributes: {', '.join(attrs) or 'none'}")
        low = d["lowerings"]
        ways = [f"decompose {x['name']} ({_opsets(x)})" for x in low["decompositions"]]
        if low["native"] is not None:
            ways.append(_native_text(low["native"]))
        if low["python"]:
            ways.append("python (numpy kernel)")
        lines.append("  lowerings:  " + ("; ".join(ways) if ways else "none"))
    if any(p["optional"] for d in dicts for p in d["inputs"] + d["outputs"]):
        lines.append("")
        lines.append("(name? marks an optional input or output)")
    return "\n".join(lines)
