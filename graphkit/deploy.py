"""``graphkit deploy``: what to ship with a model so that plain ONNX Runtime runs it.

:func:`deploy` writes a directory holding

- the native kernel library serving every native op the model needs (or every native op
  of the named op packages), linked for shipping: it looks for the libraries it links (a
  BLAS from a wheel) in its own directory (rpath ``$ORIGIN``), and they are copied there;
- ``graphkit-deploy.json`` (:data:`MANIFEST`): the ops each library serves, in which
  domains and for which element types, the ONNX Runtime C API version the library needs,
  every file's sha256, the op packages and versions it came from, the system libraries it
  expects, how to load it; and, for a model bound to Python kernels, that it needs graphkit
  at run time and what to install;
- the model itself (and its external weights) when asked.

The directory is relocatable: copied anywhere, ``register_custom_ops_library(DIR/lib)``
(Python) or ``RegisterCustomOpsLibrary_V2`` (C/C++) loads it with no graphkit and no
``LD_LIBRARY_PATH``. It is assembled in a temporary folder beside its destination, its
libraries loaded there in a separate process (which must find every library they link
inside the folder) and the model opened with them in plain onnxruntime, and only then put in
place, replacing an earlier deployment; nothing partial is ever left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphkit._invocation import wording
from graphkit.errors import NativeBuildError, OpPackageError, OutputError, UsageError

if TYPE_CHECKING:
    import onnx

    from graphkit.ops import OpRegistry

__all__ = ["MANIFEST", "DeployReport", "deploy"]

MANIFEST = "graphkit-deploy.json"
FORMAT = "graphkit-deploy/1"


@dataclass
class DeployReport:
    """What :func:`deploy` wrote: ``directory`` and its ``manifest`` (the JSON's content)."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def libraries(self) -> list[Path]:
        """The kernel libraries to register, in order."""
        return [self.directory / lib["file"] for lib in self.manifest["libraries"]]

    @property
    def model(self) -> Path | None:
        model = self.manifest.get("model")
        return self.directory / model["file"] if model and model.get("copied") else None

    def format(self) -> str:
        """The human-readable report: files, what they serve, and how to load them."""
        m = self.manifest
        python = m.get("python_kernels")
        lines = [f"wrote {self.directory}/ ({len(m['files']) + 1} files)"]
        if python:
            lines.append(f"NOTE: {python['note']}")
        for lib in m["libraries"]:
            lines.append(f"  {lib['file']}  sha256 {lib['sha256'][:16]}...  {lib['size']} bytes, "
                         f"from {', '.join(lib['packages'])}")
            for op in lib["ops"]:
                lines.append(f"    {op['domain']}::{op['name']}  {', '.join(op['element_types'])}")
        for dep in m["dependencies"]:
            origin = f"{dep['distribution']} {dep['version']}" if dep.get("distribution") else dep["from"]
            lines.append(f"  {dep['file']}  linked by the library, from {origin} (found beside it: $ORIGIN)")
        if m.get("model"):
            model = m["model"]
            lines.append(f"  {model['file']}" + ("" if model["copied"] else " (not copied: --copy-model copies it)"))
        lines.append(f"  {MANIFEST}  what is here, sha256 of every file, how to load it")
        ort = m["onnxruntime"]
        if not m["libraries"]:
            if not python:
                lines.append("the model needs no custom kernels: plain onnxruntime runs it as it is")
            return "\n".join(lines)
        lines.append(f"needs at run time: onnxruntime >= {ort['min_version']} (C API {ort['api_version']}) on "
                     f"{m['platform']['system']} {m['platform']['machine']}, a CPU with this one's features "
                     f"(-march={m['platform']['march']}), and the system's {', '.join(m['system_libraries'])}")
        where = f"{self.directory}/"
        lines.append("load it in plain onnxruntime (no graphkit):")
        lines += [f"  {line}" for line in m["load"]["python"].replace("DIR/", where).splitlines() if line]
        lines.append("from C or C++ (docs/deploy.md has a whole C program):")
        lines += [f"  {line}" for line in m["load"]["c"].replace("DIR/", where).splitlines()]
        return "\n".join(lines)


def deploy(out_dir: str | os.PathLike[str], model: str | os.PathLike[str] | onnx.ModelProto | None = None, *,
           packages: Sequence[str] = (), registry: OpRegistry | None = None, copy_model: bool = False,
           march: str | None = None) -> DeployReport:
    """Write into ``out_dir`` what a model (or the op packages named in ``packages``) needs to
    run in plain ONNX Runtime: the native kernel library, the libraries it links, the
    manifest and, with ``copy_model``, the model (a path, or an ``onnx.ModelProto`` written
    as ``model.onnx``). ``registry`` defaults to :func:`~graphkit.ops.default_registry`;
    ``march`` compiles the kernels for that CPU (``-march=``) instead of this one.

    Raises UsageError (nothing to deploy, bad ``march``), OpPackageError (a package name no
    loaded package has), UnsupportedOpError (a node without any kernel), KernelError (plain
    onnxruntime cannot open the model with the libraries), NativeBuildError (the build, or a
    library that does not load from the directory) and OutputError.
    """
    from graphkit.ops import default_registry

    if model is None and not packages:
        raise UsageError("nothing to deploy: give a model, or op packages by name",
                         hint=wording("graphkit deploy MODEL.onnx -o DIR, or graphkit deploy --package NAME -o DIR",
                                      "deploy(DIR, 'model.onnx') or deploy(DIR, packages=['graphkit_ops'])"))
    if copy_model and model is None:
        raise UsageError("copying the model needs a model", hint="name the model, or do not ask to copy it")
    if march is not None and (not march or not all(c.isalnum() or c in "-_." for c in march)):
        raise UsageError(f"-march value {march!r} is not a CPU name", hint="for example x86-64-v2 or native")
    out = Path(out_dir)
    _check_destination(out, os.fspath(out_dir))
    registry = default_registry() if registry is None else registry
    proto, path = _load(model)
    needs = _needs(proto, path, registry)
    chosen = _named_packages(registry, packages) + [p for p in needs.packages if p.name not in packages]
    chosen = list({id(p): p for p in chosen}.values())
    extra_flags = (f"-march={march}",) if march else ()
    compiled = [p for p in chosen if p.native.library is None]
    prebuilt = [p for p in chosen if p.native.library is not None]

    from graphkit.publish import signals_deferred, sweep_temporaries, temporary_path, write_error
    from graphkit.runtime import native

    libraries: list[tuple[Path, list[Any], list[Path]]] = []  # (built library, packages, dirs it links from)
    if compiled:
        built = native.library_for(compiled, registry, extra_flags=extra_flags, relocatable=True)
        dirs = [d for p in compiled for d in p.native.resolved().library_paths()]
        libraries.append((built, compiled, dirs))
    for p in prebuilt:
        libraries.append((Path(p.native.library), [p], []))

    parent = out.parent if str(out.parent) else Path(".")
    sweep_temporaries(parent, directories=True)
    tmp = temporary_path(out)
    try:
        tmp.mkdir()
        manifest = _assemble(tmp, libraries, proto, path, copy_model, needs, chosen, march, registry)
        _write_json(tmp / MANIFEST, manifest)
        with signals_deferred():
            _publish(tmp, out, os.fspath(out_dir))
    except OSError as exc:
        raise write_error(exc, out_dir, "cannot write the deployment folder") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return DeployReport(out, manifest)


# ---- inputs ------------------------------------------------------------------------------


def _load(model: Any) -> tuple[Any, str | None]:
    if model is None:
        return None, None
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model, None
    if not isinstance(model, (str, os.PathLike)):
        raise UsageError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    from graphkit.modelio import load_model

    return load_model(model), os.fspath(model)


def _needs(proto: Any, path: str | None, registry: Any) -> Any:
    from graphkit.runtime.session import KernelNeeds, kernel_needs

    if proto is None:
        return KernelNeeds({}, {}, (), False)
    return kernel_needs(proto, registry, path=path)


def _named_packages(registry: Any, names: Sequence[str]) -> list[Any]:
    found = []
    for name in names:
        package = next((p for p in registry.packages if p.name == name), None)
        if package is None:
            raise OpPackageError(f"no loaded op package is named {name!r}; loaded: "
                                 f"{', '.join(p.name for p in registry.packages)}",
                                 hint=wording("load it with --ops MODULE (or $GRAPHKIT_OPS), or install it",
                                              "pass registry=graphkit.ops.discover(['MODULE']), or install it"))
        if package.native is None or not package.native_ops():
            raise UsageError(f"op package {name} has no native kernels to deploy",
                             hint="its ops run decomposed (graphkit rewrite) or as Python kernels, "
                                  "which need graphkit at run time")
        found.append(package)
    return found


def _check_destination(out: Path, raw: str) -> None:
    """The destination must be a new folder, an empty one or an earlier deployment."""
    if raw.endswith(("/.", "/..")) or raw in (".", ".."):
        raise OutputError("name the deployment folder itself, not '.' or '..'", path=raw,
                          hint="for example -o deploy/")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError("the deployment folder's parent does not exist", path=raw, hint=f"create {parent} first")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputError("the deployment folder exists and is not a folder", path=raw,
                          hint="choose another name, or remove it")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise OutputError(f"the folder holds files and is no deployment graphkit wrote (no {MANIFEST})",
                          path=raw, hint="choose a new or empty folder; graphkit replaces only its own")
    from graphkit.publish import unwritable_dir_error

    unwritable = unwritable_dir_error(parent, raw, "deployment folder's parent")
    if unwritable is not None:
        raise unwritable


# ---- the directory ------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _copy(src: Path, dst: Path) -> dict[str, Any]:
    shutil.copyfile(src, dst)  # follows symlinks: the copy is the file
    os.chmod(dst, 0o755 if os.access(src, os.X_OK) else 0o644)
    return {"file": dst.name, "sha256": _sha256(dst), "size": dst.stat().st_size}


def _assemble(tmp: Path, libraries: list[tuple[Path, list[Any], list[Path]]], proto: Any, path: str | None,
              copy_model: bool, needs: Any, chosen: list[Any], march: str | None, registry: Any) -> dict[str, Any]:
    from graphkit.runtime._elf import dynamic_section, resolve_needed

    libs, deps, system, sources = [], [], [], []
    for lib, pkgs, dirs in libraries:
        if (tmp / lib.name).exists():
            raise UsageError(f"two kernel libraries are named {lib.name}", hint="rename one package's prebuilt library")
        entry = {**_copy(lib, tmp / lib.name), "packages": [p.name for p in pkgs]}
        libs.append(entry)
        todo = [(lib, dirs)]
        while todo:  # what the library links, and what those link, found where they were built
            current, search = todo.pop()
            for name in _needed(current, dynamic_section):
                found = resolve_needed(current, name, search)
                if found is None or found.resolve() == current.resolve():
                    if name not in system and not (tmp / name).exists():
                        system.append(name)
                    continue
                if not (tmp / name).exists():
                    deps.append({**_copy(found, tmp / name), "from": str(found), **_distribution(found)})
                    sources.append(found.resolve())
                    todo.append((found, [found.parent]))
    loaded = _load_check(tmp, [e["file"] for e in libs], sources)
    for entry in libs:
        info = loaded[entry["file"]]
        entry["api_version"] = info["api"]
        entry["ops"] = _ops(info)
        entry["domains"] = sorted({op["domain"] for op in entry["ops"]})
    model_entry = _model_entry(tmp, proto, path, copy_model, needs) if proto is not None else None
    if model_entry is not None and not (needs.python or needs.extensions):
        where = tmp / model_entry["file"] if copy_model else path
        if where is not None:
            _session_check(Path(where), [tmp / e["file"] for e in libs])
    api = max((e["api_version"] or 0 for e in libs), default=0) or None
    return {
        "format": FORMAT,
        "created_by": _versions(),
        # ONNX Runtime 1.N brought C API version N
        "onnxruntime": {"api_version": api, "min_version": f"1.{api}" if api else None},
        "platform": {"system": platform.system(), "machine": platform.machine(), "march": march or "native",
                     "cpu": _cpu_name()},
        "libraries": libs,
        "dependencies": deps,
        "system_libraries": system,
        "packages": [_package_entry(p) for p in chosen],
        "model": model_entry,
        "python_kernels": _python_note(needs, registry, model_entry),
        "load": _load_text(libs, model_entry),
        "files": sorted([*(e["file"] for e in libs), *(d["file"] for d in deps),
                         *((model_entry or {}).get("files", []))]),
    }


def _needed(lib: Path, dynamic_section: Any) -> list[str]:
    try:
        return dynamic_section(lib).needed
    except (OSError, ValueError) as exc:
        raise NativeBuildError(f"cannot read what {lib} links: {exc}", path=str(lib),
                               hint="rebuild it (delete its cache entry) or reinstall the package") from exc


def _distribution(path: Path) -> dict[str, str]:
    """The installed distribution a file comes from (a wheel's library), if any."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    real, owners = path.resolve(), packages_distributions()
    for entry in map(Path, sys.path):
        with contextlib.suppress(ValueError, OSError):
            top = real.relative_to(entry.resolve()).parts[0]
            for dist in owners.get(top, []):
                with contextlib.suppress(PackageNotFoundError):
                    return {"distribution": dist, "version": version(dist)}
    return {}


# The check runs in a fresh interpreter (no site, no LD_LIBRARY_PATH): it loads each library
# from the new folder and reports what it serves and which files the loader mapped.
_CHECK = r"""
import ctypes, json, sys
out = {}
for path in sys.argv[1:]:
    lib = ctypes.CDLL(path)
    info = {}
    for name in ("graphkit_native_ops", "graphkit_native_op_types"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            info[name] = (fn() or b"").decode()
    api = getattr(lib, "graphkit_native_api_version", None)
    if api is not None:
        api.restype = ctypes.c_uint32
        info["api"] = api()
    out[path] = info
maps = set()
with open("/proc/self/maps") as f:
    for line in f:
        part = line.split(None, 5)
        if len(part) == 6 and part[5].strip().startswith("/"):
            maps.add(part[5].strip())
print(json.dumps({"libraries": out, "maps": sorted(maps)}))
"""


def _load_check(tmp: Path, files: list[str], sources: list[Path]) -> dict[str, dict[str, Any]]:
    """Load every library from ``tmp`` in a child process: each must load, and every library
    it links that was copied must come from ``tmp``, not from where it was copied from."""
    if not files:
        return {}
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    paths = [str((tmp / f).resolve()) for f in files]
    proc = subprocess.run([sys.executable, "-S", "-c", _CHECK, *paths], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise NativeBuildError(f"the deployed kernel library does not load from its folder: "
                               f"{last.removeprefix('OSError: ')}", path=paths[0],
                               hint="a library it links is missing beside it; check the package's "
                                    "NativeKernels(library_dirs=..., libraries=...)")
    report = json.loads(proc.stdout)
    outside = sorted({m for m in report["maps"] if Path(m).resolve() in sources})
    if outside:
        raise NativeBuildError(f"the deployed kernel library loaded {', '.join(outside)} from outside its "
                               "folder (a library it links finds its own dependencies elsewhere)",
                               path=paths[0], hint="link that library so it finds its dependencies "
                                                   "beside it ($ORIGIN), or ship the deployment with it")
    return {Path(p).name: {"api": info.get("api"), "ops": info.get("graphkit_native_ops"),
                           "types": info.get("graphkit_native_op_types")}
            for p, info in report["libraries"].items()}


# Plain onnxruntime opens the model with the deployed libraries registered, as a service would.
_SESSION_CHECK = r"""
import sys, onnxruntime as ort
so = ort.SessionOptions()
for lib in sys.argv[2:]:
    so.register_custom_ops_library(lib)
ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
"""


def _session_check(model: Path, libraries: list[Path]) -> None:
    from graphkit.errors import KernelError

    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    proc = subprocess.run([sys.executable, "-c", _SESSION_CHECK, str(model), *map(str, libraries)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise KernelError(f"plain onnxruntime cannot open the model with the deployed libraries: {last}",
                          path=str(model), hint="`graphkit run` on the model names what it lacks; rewrite "
                                                "it with --bind native, or decompose what no kernel serves")


def _type_name(number: int) -> str:
    import onnx

    try:
        return onnx.TensorProto.DataType.Name(number).lower()
    except ValueError:
        return str(number)


def _ops(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's ops of one library: served ops with their kernels' element types."""
    if info["ops"] is None:  # a prebuilt library does not list what it serves
        return []
    types: dict[str, list[dict[str, list[str]]]] = {}
    for entry in filter(None, (info["types"] or "").split(";")):
        name, _, kernels = entry.partition("=")
        types[name] = [{"inputs": [_type_name(int(t)) for t in ins.split(",") if t],
                        "outputs": [_type_name(int(t)) for t in outs.split(",") if t]}
                       for ins, _, outs in (k.partition(">") for k in kernels.split("|") if k)]
    ops = []
    for qualified in filter(None, info["ops"].split(",")):
        domain, _, name = qualified.rpartition("::")
        kernels = types.get(qualified, [])
        element_types = list(dict.fromkeys(k["inputs"][0] for k in kernels if k["inputs"]))
        ops.append({"domain": domain, "name": name, "element_types": element_types, "kernels": kernels})
    return ops


def _model_entry(tmp: Path, proto: Any, path: str | None, copy_model: bool, needs: Any) -> dict[str, Any]:
    from graphkit.external_data import check_external_data, external_tensors

    name = Path(path).name if path else "model.onnx"
    entry: dict[str, Any] = {"file": name, "copied": copy_model, "from": path,
                             "nodes": {**needs.native, **needs.python}, "files": []}
    if not copy_model:
        return entry
    if path is not None:
        entry.update(_copy(Path(path), tmp / name))
        files = check_external_data(proto, path) if external_tensors(proto) else {}
        for location, src in files.items():
            dst = tmp / location
            dst.parent.mkdir(parents=True, exist_ok=True)
            _copy(src, dst)
            entry["files"].append(location)
    else:
        from graphkit.modelio import save_model

        save_model(proto, tmp / name)
        entry.update({"sha256": _sha256(tmp / name), "size": (tmp / name).stat().st_size})
    entry["files"].insert(0, name)
    return entry


def _package_entry(package: Any) -> dict[str, Any]:
    return {"name": package.name, "version": package.version or None, "origin": package.origin or None,
            "distribution": _package_distribution(package)}


def _package_distribution(package: Any) -> str | None:
    from graphkit.ops._discovery import BUILTIN_PACKAGE

    if package.name == BUILTIN_PACKAGE:
        return "graphkit-onnx"
    origin = package.origin or ""
    return origin.removeprefix("entry point of ") if origin.startswith("entry point of ") else None


def _python_note(needs: Any, registry: Any, model: dict[str, Any] | None) -> dict[str, Any] | None:
    """A model bound to Python kernels needs graphkit and its op packages at run time."""
    if not needs.python and not needs.extensions:
        return None
    from graphkit import __version__

    install = [f"graphkit-onnx=={__version__}", "onnxruntime-extensions"]
    packages = []
    for p in _python_packages(needs, registry):
        dist = _package_distribution(p)
        packages.append(p.name)
        if dist and dist != "graphkit-onnx":
            install.append(f"{dist}=={p.version}" if p.version else dist)
        elif dist is None:
            install.append(f"the op package {p.name} (loaded from {p.origin or 'a file'}: not installed; "
                           "ship it and name it in $GRAPHKIT_OPS)")
    ops = sorted(needs.python) or ["onnxruntime-extensions' own ops"]
    name = model["file"] if model else "MODEL.onnx"
    return {"ops": ops, "packages": packages, "install": install,
            "open_with": f"graphkit.open_session('{name}')",
            "note": (f"{sum(needs.python.values()) or 'some'} node(s) of this model run Python kernels "
                     f"({', '.join(ops)}): plain onnxruntime cannot run them, it needs graphkit and the op "
                     f"packages at run time: pip install {' '.join(i for i in install if ' ' not in i)}"
                     + "".join(f"; {i}" for i in install if " " in i)
                     + f"; then open it with graphkit.open_session('{name}') or `graphkit run {name}`. "
                       "Without graphkit: rewrite it with --bind native (or decompose) and deploy that")}


def _python_packages(needs: Any, registry: Any) -> list[Any]:
    found = {}
    for qualified in needs.python:
        domain, _, name = qualified.rpartition("::")
        op = registry.lookup(domain, name)
        package = registry.package_of(op) if op is not None else None
        if package is not None:
            found[id(package)] = package
    return list(found.values())


def _load_text(libs: list[dict[str, Any]], model: dict[str, Any] | None) -> dict[str, str]:
    model_path = f"DIR/{model['file']}" if model and model["copied"] else "MODEL.onnx"
    py = ["import onnxruntime as ort", "", "so = ort.SessionOptions()"]
    py += [f'so.register_custom_ops_library("DIR/{lib["file"]}")' for lib in libs]
    py += [f'session = ort.InferenceSession("{model_path}", so)']
    c = ["const OrtApi* api = OrtGetApiBase()->GetApi(17);   /* OrtApi slots: docs/deploy.md */",
         "api->CreateSessionOptions(&options);"]
    c += [f'api->RegisterCustomOpsLibrary_V2(options, "DIR/{lib["file"]}");' for lib in libs]
    c += [f'api->CreateSession(env, "{model_path}", options, &session);',
          "/* C++: Ort::SessionOptions so; so.RegisterCustomOpsLibrary(\"DIR/...\"); */"]
    return {"python": "\n".join(py), "c": "\n".join(c), "dir": "DIR is this folder, wherever it is copied"}


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    from graphkit import __version__

    out: dict[str, str | None] = {"graphkit": __version__, "python": platform.python_version()}
    for dist in ("onnxruntime", "onnx"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _cpu_name() -> str | None:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _publish(tmp: Path, out: Path, raw: str) -> None:
    """Put the assembled folder in place: a new name is one rename; an earlier deployment is
    moved aside, replaced and removed (the destination is never a mix of both)."""
    if not out.exists():
        os.rename(tmp, out)
        return
    if not out.is_dir() or out.is_symlink():
        raise OutputError("the deployment folder appeared meanwhile and is not a folder", path=raw,
                          hint="choose another name")
    from graphkit.publish import temporary_path

    old = temporary_path(out)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
