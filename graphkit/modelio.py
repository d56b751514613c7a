"""Loading and saving models safely: clear errors, input never touched, atomic writes."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from graphkit.errors import ModelLoadError, OutputError
from graphkit.publish import atomic_write, missing_parent_error, refuse_special_output, unwritable_dir_error

__all__ = ["load_model", "save_model", "check_output_path", "weights_files", "read_model_bytes",
           "parse_model_bytes"]

PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse an ONNX file without loading external weights.

    Raises ModelLoadError for a missing file, a directory, an empty, truncated or
    non-ONNX file.
    """
    return parse_model_bytes(read_model_bytes(path), path)


def read_model_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an ONNX file, with load_model's errors for what cannot be read."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelLoadError("no such file", path=str(p), hint="check the path") from None
    except (OSError, ValueError) as exc:  # ENAMETOOLONG, ELOOP, ENOTDIR, an embedded NUL byte
        raise ModelLoadError(f"cannot open: {getattr(exc, 'strerror', None) or exc}", path=str(p),
                             hint="check the path") from exc
    if stat.S_ISDIR(st.st_mode):
        raise ModelLoadError("is a directory, not an ONNX file", path=str(p),
                             hint="pass the .onnx file inside it")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO, socket or device could block forever or never end: never opened.
        raise ModelLoadError("is not a regular file (a pipe, socket or device)", path=str(p),
                             hint="save the model to a file first")
    if st.st_size > PROTOBUF_LIMIT:
        raise ModelLoadError(f"is {st.st_size} bytes, over protobuf's 2 GiB limit for one ONNX file",
                             path=str(p), hint="keep the weights in external data files")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read: {exc.strerror}", path=str(p),
                             hint="check the file's permissions") from exc
    except MemoryError:
        raise ModelLoadError(f"not enough memory to read {st.st_size} bytes", path=str(p),
                             hint="free some memory or raise the process's memory limit") from None
    if not data:
        raise ModelLoadError("file is empty", path=str(p), hint="re-export the model")
    return data


def parse_model_bytes(data: bytes, path: str | os.PathLike[str]) -> onnx.ModelProto:
    """Parse a serialized ONNX model read from ``path``, with load_model's errors."""
    p = Path(path)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError("not an ONNX model or truncated (protobuf parse failed)", path=str(p),
                             hint="re-export the model or check the file was copied whole") from exc
    except MemoryError:
        raise ModelLoadError("not enough memory to parse the model", path=str(p),
                             hint="free some memory or raise the process's memory limit") from None
    # A file cut at a field boundary parses; what it lost shows as missing parts.
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        missing = [name for name, ok in (("graph", model.HasField("graph")),
                                         ("opset_import", bool(model.opset_import)),
                                         ("ir_version", model.ir_version > 0)) if not ok]
        raise ModelLoadError(f"not an ONNX model or truncated (missing {', '.join(missing)})",
                             path=str(p), hint="re-export the model or check the file was copied whole")
    return model


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    return a.exists() and b.exists() and os.path.samefile(a, b)


def check_output_path(output: str | os.PathLike[str], input_path: str | os.PathLike[str] | None,
                      *, inputs: tuple[tuple[str | os.PathLike[str], str], ...] = ()) -> None:
    """Refuse to overwrite the input or write into a missing directory, before any work.

    ``inputs`` lists other files read, as (path, what) pairs: the output must be none of them.
    """
    out = Path(output)
    try:
        refuse_special_output(out, os.fspath(output))
        _check_output_path(out, input_path, inputs)
    except (OSError, RuntimeError, ValueError) as exc:  # ELOOP, ENAMETOOLONG, NUL byte
        raise OutputError(f"unusable output path: {getattr(exc, 'strerror', None) or exc}", path=str(out),
                          hint="choose another output path") from exc


def _check_output_path(out: Path, input_path, inputs) -> None:
    if input_path is not None:
        if _same_file(out, Path(input_path)):
            raise OutputError("output is the input file", path=str(out),
                              hint="write to a new file; graphkit never overwrites its input")
    for other, what in inputs:
        if _same_file(out, Path(other)):
            raise OutputError(f"output is the {what}", path=str(out),
                              hint="write to a new file; graphkit never overwrites what it reads")
    if out.is_dir():
        raise OutputError("output path is a directory", path=str(out), hint="give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise missing_parent_error(out, str(out))
    unwritable = unwritable_dir_error(parent, str(out))
    if unwritable is not None:
        raise unwritable


def weights_files(files: dict[str, Path], output: str | os.PathLike[str]) -> tuple[tuple[Path, str], ...]:
    """The external-data files an output at ``output`` must not replace: the input's own
    (``files``: location -> file, from check_external_data) and those it will need beside it."""
    out_dir = Path(output).resolve().parent
    return tuple((f, f"external data file '{location}' of the input") for location, f in files.items()) + \
        tuple((out_dir / location, f"external data file '{location}' the output needs")
              for location in files)


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
    placed: dict[Path, tuple[int, int]] = {}
    if external_tensors(model):
        if input_path is None:
            raise OutputError("the model references external data but its source is unknown", path=str(path),
                              hint="pass input_path= so the weights can be found")
        files = check_external_data(model, input_path)
        check_output_path(path, input_path, inputs=weights_files(files, path))
        out_dir = Path(path).resolve().parent
        if out_dir != Path(input_path).resolve().parent:
            created = place_external_data(files, out_dir, external_data, placed=placed)
    mine: list[tuple[int, int]] = []
    try:
        if model.ByteSize() > PROTOBUF_LIMIT:
            raise OutputError("model is over protobuf's 2 GiB limit and has inline weights",
                              path=str(path), hint="move its weights to external data first")
        with atomic_write(path) as tmp:
            tmp.write_bytes(model.SerializeToString())
            st = os.stat(tmp)
            mine.append((st.st_dev, st.st_ino))
        # Published: its weights must still be the files placed for it (no other job's).
        for target, ident in placed.items():
            try:
                st = os.stat(target)
                now = (st.st_dev, st.st_ino)
            except OSError:
                now = None
            if now != ident:
                if _is(path, mine):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise OutputError(f"its weights file '{target.name}' was removed or replaced by another "
                                  "process while the model was written", path=str(path),
                                  hint="write each job's output into its own directory")
    except BaseException:
        if not _is(path, mine):  # never published (or withdrawn): nothing partial stays
            for f in created:
                with contextlib.suppress(OSError):
                    f.unlink()
        raise


def _is(path: str | os.PathLike[str], identity: list[tuple[int, int]]) -> bool:
    """Whether ``path`` is the file of ``identity`` (a one-element list, or empty)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return bool(identity) and (st.st_dev, st.st_ino) == identity[0]
