"""External data: validated, never loaded, carried to wherever the output is written.

A location must stay inside the model's directory: absolute paths, paths climbing out
with '..' and symlinks leading out are refused before anything is read or copied (the
class of ONNX's CVE-2024-27318).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graphkit.errors import ModelLoadError, OutputError, UsageError

__all__ = ["MODES", "external_tensors", "external_data_locations", "check_external_data",
           "place_external_data"]

MODES = ("auto", "link", "copy")


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of the model (initializers, attributes, every scope) stored externally."""
    from graphkit.rewrite._walk import graphs, scopes

    external = onnx.TensorProto.EXTERNAL
    tensors: list[onnx.TensorProto] = []
    for nodes, _, initializers in scopes(model):
        tensors.extend(initializers)
        for node in nodes:
            if node.attribute:
                for attr in node.attribute:
                    if attr.type == onnx.AttributeProto.TENSOR:
                        tensors.append(attr.t)
                    elif attr.type == onnx.AttributeProto.TENSORS:
                        tensors.extend(attr.tensors)
    for g in graphs(model.graph):
        for sparse in g.sparse_initializer:
            tensors.extend((sparse.values, sparse.indices))
    return [t for t in tensors if t.data_location == external]


def _entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def external_data_locations(model: onnx.ModelProto) -> set[str]:
    """The external-data file locations the model's tensors reference."""
    return {_entries(t).get("location", "") for t in external_tensors(model)}


def _resolve(location: str, base: Path, path: str, tensor: str) -> Path:
    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(f"tensor '{tensor}': external data location '{location}' {why}", path=path,
                              hint="external data must be a relative path inside the model's directory")

    if not location:
        raise refuse("is empty")
    if "\0" in location:
        raise refuse("contains a NUL byte")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise refuse("is absolute")
    if ".." in Path(location.replace("\\", "/")).parts:
        raise refuse("climbs out of the model's directory")
    target = base / location
    try:
        real_base = base.resolve()
        real = target.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise refuse(f"cannot be resolved ({getattr(exc, 'strerror', None) or exc})") from exc
    if real != real_base and real_base not in real.parents:
        raise refuse("leads out of the model's directory through a symlink")
    try:
        st = real.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})") from exc
    if st is None:
        raise ModelLoadError(f"tensor '{tensor}': external data file '{location}' is missing", path=path,
                             hint="copy the weights file next to the model")
    if not stat.S_ISREG(st.st_mode):
        # A directory, FIFO or device: never opened (it could block or never end).
        raise ModelLoadError(f"tensor '{tensor}': external data file '{location}' is not a regular file",
                             path=path, hint="external data must be a regular file next to the model")
    return real


def check_external_data(model: onnx.ModelProto, model_path: str | os.PathLike[str]) -> dict[str, Path]:
    """Validate every external reference of ``model`` (loaded from ``model_path``) without reading data.

    Returns location -> resolved file. Raises ModelLoadError for a location outside the
    model's directory, a missing file, or an offset/length past the end of the file.
    """
    base = Path(model_path).parent
    files: dict[str, Path] = {}
    for t in external_tensors(model):
        entries = _entries(t)
        location = entries.get("location", "")
        if location not in files:
            files[location] = _resolve(location, base, str(model_path), t.name)
        size = files[location].stat().st_size
        try:
            offset = int(entries.get("offset", 0))
            length = int(entries["length"]) if "length" in entries else None
        except ValueError as exc:
            raise ModelLoadError(f"tensor '{t.name}': external data offset/length is not a number",
                                 path=str(model_path), hint="re-export the model") from exc
        if length is None:
            if t.data_type == onnx.TensorProto.STRING:
                itemsize = 0
            else:
                try:
                    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
                except (KeyError, TypeError, ValueError) as exc:
                    raise ModelLoadError(f"tensor '{t.name}': unknown data type {t.data_type} and no external "
                                         "data length", path=str(model_path), hint="re-export the model") from exc
            if any(d < 0 for d in t.dims):
                raise ModelLoadError(f"tensor '{t.name}': negative dimension in {list(t.dims)}",
                                     path=str(model_path), hint="re-export the model")
            length = math.prod(t.dims) * itemsize  # Python ints: absurd dims cannot wrap around
        if offset < 0 or length < 0 or offset + length > size:
            raise ModelLoadError(
                f"tensor '{t.name}': external data [{offset}, {offset + length}) is past the end of "
                f"'{location}' ({size} bytes)", path=str(model_path),
                hint="the weights file is truncated or does not belong to this model")
    return files


def place_external_data(files: dict[str, Path], out_dir: Path, mode: str = "auto") -> list[Path]:
    """Make every location valid from ``out_dir``: link (hard link) or copy the files.

    Returns the files it created, for the caller to remove if the model write fails.
    Never overwrites a different existing file.
    """
    if mode not in MODES:
        raise UsageError(f"unknown external data mode '{mode}'", hint=f"use one of {', '.join(MODES)}")
    created: list[Path] = []
    try:
        for location, source in sorted(files.items()):
            target = out_dir / location
            if target.exists():
                if os.path.samefile(target, source):
                    continue
                raise OutputError(f"'{target}' exists and is not the model's weights file", path=str(target),
                                  hint="write the output into another directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.graphkit-tmp")
            try:
                linked = False
                if mode in ("auto", "link"):
                    try:
                        os.link(source, tmp)
                        linked = True
                    except OSError as exc:
                        if mode == "link":
                            raise OutputError(f"cannot hard-link the weights file: {exc.strerror}",
                                              path=str(target), hint="use --external-data copy") from exc
                if not linked:
                    shutil.copyfile(source, tmp)
                os.replace(tmp, target)
            except OSError as exc:
                hint = "free some space" if exc.errno in (errno.ENOSPC, errno.EFBIG) else "choose a writable location"
                raise OutputError(f"cannot place the weights file: {exc.strerror or exc}", path=str(target),
                                  hint=hint) from exc
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            created.append(target)
    except BaseException:
        for f in created:
            with contextlib.suppress(OSError):
                f.unlink()
        raise
    return created
