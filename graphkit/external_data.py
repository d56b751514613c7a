"""External data: validated, never loaded, carried to wherever the output is written.

A location must stay inside the model's directory: absolute paths, paths climbing out
with '..' and symlinks leading out are refused before anything is read or copied (the
class of ONNX's CVE-2024-27318).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graphkit.errors import ModelLoadError, OutputError, UsageError
from graphkit.publish import remove_quietly, signals_deferred, sweep_temporaries, temporary_path, write_error

__all__ = ["MODES", "external_tensors", "external_data_locations", "check_external_data",
           "place_external_data"]

MODES = ("auto", "link", "copy")


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of the model (initializers, attributes, every scope) stored externally."""
    from graphkit.rewrite.graph.walk import graphs, scopes

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


def check_external_data(model: onnx.ModelProto, model_path: str | os.PathLike[str], *,
                        extents: dict[str, int] | None = None) -> dict[str, Path]:
    """Validate every external reference of ``model`` (loaded from ``model_path``) without reading data.

    Returns location -> resolved file; ``extents``, if given, receives location -> the bytes
    of the file its tensors use (the largest offset + length). Raises ModelLoadError for a
    location outside the model's directory, a missing file, or an offset/length past the
    end of the file.
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
        if extents is not None:
            extents[location] = max(extents.get(location, 0), offset + length)
    return files


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _same_bytes(a: Path, b: Path, size: int) -> bool:
    """Whether regular files ``a`` and ``b`` (both ``size`` bytes) hold the same bytes."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        if os.fstat(fa.fileno()).st_size != size or os.fstat(fb.fileno()).st_size != size:
            return False
        while True:
            x = fa.read(1 << 20)
            if x != fb.read(1 << 20):
                return False
            if not x:
                return True


def _collision(target: Path, why: str) -> OutputError:
    return OutputError(f"'{target.name}' exists in the output directory and {why}", path=str(target),
                       hint="write the output into another directory, or let the job writing there finish")


def place_external_data(files: dict[str, Path], out_dir: Path, mode: str = "auto",
                        placed: dict[Path, tuple[int, int]] | None = None) -> list[Path]:
    """Make every location valid from ``out_dir``: link (hard link) or copy the files.

    Returns the files it created, for the caller to remove if the model write fails.
    ``placed``, if given, receives target -> (st_dev, st_ino) for every file the output uses
    (created or found), for the caller to check they are still there once the model is written.

    Never overwrites an existing file: each one is linked or copied to a unique temporary
    (publish.temporary_path), then published with os.link, which fails rather than replace
    a file another job published meanwhile; after publishing, the target is checked to be
    that very file. An existing file with the same bytes is used as it is; a different one is
    an OutputError, so two jobs can never pair a model with the other's weights.
    """

    if mode not in MODES:
        raise UsageError(f"unknown external data mode '{mode}'", hint=f"use one of {', '.join(MODES)}")
    created: list[Path] = []
    swept: set[Path] = set()
    publishing: tuple[Path, tuple[int, int]] | None = None  # linked, maybe not yet in `created`
    try:
        for location, source in sorted(files.items()):
            target = out_dir / location
            try:
                src_st = os.stat(source)
            except OSError as exc:
                raise ModelLoadError(f"cannot read the weights file: {exc.strerror}", path=str(source),
                                     hint="check the weights file next to the model") from exc

            def reuse() -> bool:
                """Whether the existing target can be used as it is (raises if it cannot)."""
                try:
                    st = os.stat(target)
                except FileNotFoundError:
                    return False
                except OSError as exc:
                    raise _collision(target, f"cannot be checked ({exc.strerror})") from exc
                if not stat.S_ISREG(st.st_mode):
                    raise _collision(target, "is not a regular file")
                if _identity(st) != _identity(src_st) and (
                        st.st_size != src_st.st_size or not _same_bytes(target, source, src_st.st_size)):
                    raise _collision(target, "is not the model's weights file")
                if placed is not None:
                    placed[target] = _identity(st)
                return True

            if reuse():
                continue
            tmp = temporary_path(target)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.parent not in swept:
                    swept.add(target.parent)
                    sweep_temporaries(target.parent, tuple(Path(loc).name for loc in files))
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
                    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                    shutil.copyfile(source, tmp)
                    with open(tmp, "rb+") as fh:
                        os.fsync(fh.fileno())
                tmp_st = os.stat(tmp)
                if tmp_st.st_size != src_st.st_size:
                    raise OutputError(f"the weights file changed while it was copied ({src_st.st_size} "
                                      f"bytes, copy {tmp_st.st_size})", path=str(source),
                                      hint="do not modify the input while graphkit reads it")
                # A copy's inode is ours alone (a hard link's is the source's, maybe another job's too).
                publishing = None if linked else (target, _identity(tmp_st))
                with signals_deferred():  # published and recorded, or neither
                    try:
                        os.link(tmp, target)  # EEXIST rather than replace another job's file
                    except FileExistsError:
                        published = False
                    else:
                        published = True
                        created.append(target)
                publishing = None
                if not published:
                    if reuse():
                        continue
                    raise _collision(target, "vanished while it was published")
                st = os.stat(target)
                if _identity(st) != _identity(tmp_st) or st.st_size != src_st.st_size:
                    raise _collision(target, "was replaced by another process while it was published")
                if placed is not None:
                    placed[target] = _identity(st)
            except OSError as exc:
                raise write_error(exc, target, "cannot place the weights file") from exc
            finally:
                remove_quietly(tmp)
    except BaseException:
        if publishing is not None and publishing[0] not in created:
            # A signal handled on the way (another thread took it): remove it if it is ours.
            with contextlib.suppress(OSError):
                if _identity(os.stat(publishing[0])) == publishing[1]:
                    created.append(publishing[0])
        for f in created:
            with contextlib.suppress(OSError):
                f.unlink()
        raise
    return created
