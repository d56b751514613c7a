"""Loading and saving models safely: clear errors, input never touched, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from graphkit.errors import ModelLoadError, OutputError

__all__ = ["load_model", "save_model", "atomic_write", "check_output_path"]

_PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse an ONNX file without loading external weights.

    Raises ModelLoadError for a missing file, a directory, an empty, truncated or
    non-ONNX file.
    """
    p = Path(path)
    if not p.exists():
        raise ModelLoadError("no such file", path=str(p), hint="check the path")
    if p.is_dir():
        raise ModelLoadError("is a directory, not an ONNX file", path=str(p),
                             hint="pass the .onnx file inside it")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read: {exc.strerror}", path=str(p),
                             hint="check the file's permissions") from exc
    if not data:
        raise ModelLoadError("file is empty", path=str(p), hint="re-export the model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError("not an ONNX model or truncated (protobuf parse failed)", path=str(p),
                             hint="re-export the model or check the file was copied whole") from exc
    # A file cut at a field boundary parses; what it lost shows as missing parts.
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        missing = [name for name, ok in (("graph", model.HasField("graph")),
                                         ("opset_import", bool(model.opset_import)),
                                         ("ir_version", model.ir_version > 0)) if not ok]
        raise ModelLoadError(f"not an ONNX model or truncated (missing {', '.join(missing)})",
                             path=str(p), hint="re-export the model or check the file was copied whole")
    return model


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError("output directory does not exist", path=str(target),
                          hint=f"create {parent} first")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise OutputError(f"cannot write to the output directory: {exc.strerror}", path=str(target),
                          hint="choose a writable location") from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp, target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask())
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if target.is_dir():
            raise OutputError("output path is a directory", path=str(target),
                              hint="give a file name")
        os.replace(tmp, target)
    except OSError as exc:
        hint = "free some space" if exc.errno in (errno.ENOSPC, errno.EFBIG) else "choose a writable location"
        raise OutputError(f"cannot write: {exc.strerror or exc}", path=str(target), hint=hint) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def check_output_path(output: str | os.PathLike[str], input_path: str | os.PathLike[str] | None) -> None:
    """Refuse to overwrite the input or write into a missing directory, before any work."""
    out = Path(output)
    if input_path is not None:
        inp = Path(input_path)
        same = out.resolve() == inp.resolve()
        if not same and out.exists() and inp.exists():
            same = os.path.samefile(out, inp)
        if same:
            raise OutputError("output is the input file", path=str(out),
                              hint="write to a new file; graphkit never overwrites its input")
    if out.is_dir():
        raise OutputError("output path is a directory", path=str(out), hint="give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError("output directory does not exist", path=str(out), hint=f"create {parent} first")
    if not os.access(parent, os.W_OK):
        raise OutputError("output directory is not writable", path=str(out),
                          hint="choose a writable location")


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str], *,
               input_path: str | os.PathLike[str] | None = None, external_data: str = "auto") -> None:
    """Write ``model`` to ``path`` atomically; never over ``input_path``.

    Weights kept in external files next to ``input_path`` are validated (never read) and
    made valid from the output's directory: hard-linked where possible, else copied
    (``external_data``: "auto", "link" or "copy"). Nothing partial is left on failure.
    """
    from graphkit.external_data import check_external_data, external_tensors, place_external_data

    check_output_path(path, input_path)
    created: list[Path] = []
    if external_tensors(model):
        if input_path is None:
            raise OutputError("the model references external data but its source is unknown", path=str(path),
                              hint="pass input_path= so the weights can be found")
        files = check_external_data(model, input_path)
        out_dir = Path(path).resolve().parent
        if out_dir != Path(input_path).resolve().parent:
            created = place_external_data(files, out_dir, external_data)
    if model.ByteSize() > _PROTOBUF_LIMIT:
        raise OutputError("model is over protobuf's 2 GiB limit and has inline weights",
                          path=str(path), hint="move its weights to external data first")
    try:
        with atomic_write(path) as tmp:
            tmp.write_bytes(model.SerializeToString())
    except BaseException:
        for f in created:
            with contextlib.suppress(OSError):
                f.unlink()
        raise
