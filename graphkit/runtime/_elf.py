"""What a shared library asks of the dynamic loader: its DT_NEEDED, DT_RUNPATH/DT_RPATH and
DT_SONAME entries, read from the ELF file (no binutils needed). Used by ``graphkit deploy``
to find the libraries a kernel library links, so they can be shipped beside it."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Dynamic", "dynamic_section", "resolve_needed"]

_SHT_DYNAMIC = 6
_DT_NEEDED, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 1, 14, 15, 29


@dataclass
class Dynamic:
    needed: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)  # DT_RUNPATH, else DT_RPATH, split on ':'
    soname: str | None = None


def dynamic_section(path: str | os.PathLike[str]) -> Dynamic:
    """The dynamic-section entries of the ELF shared library at ``path``. Raises ValueError for
    a file that is not ELF or is damaged, OSError when it cannot be read."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("not an ELF file")
    wide, o = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            shoff, = struct.unpack_from(o + "Q", data, 40)
            shentsize, shnum = struct.unpack_from(o + "HH", data, 58)
            sec, dyn = o + "IIQQQQIIQQ", o + "qQ"
        else:
            shoff, = struct.unpack_from(o + "I", data, 32)
            shentsize, shnum = struct.unpack_from(o + "HH", data, 46)
            sec, dyn = o + "IIIIIIIIII", o + "iI"
        sections = [struct.unpack_from(sec, data, shoff + i * shentsize) for i in range(shnum)]
        out = Dynamic()
        rpath: list[str] = []
        for s in sections:
            if s[1] != _SHT_DYNAMIC:
                continue
            offset, size, link = s[4], s[5], s[6]
            strtab = sections[link][4]

            def text(at: int) -> str:
                end = data.index(b"\0", strtab + at)
                return data[strtab + at:end].decode("utf-8", "surrogateescape")

            step = struct.calcsize(dyn)
            for at in range(offset, offset + size, step):
                tag, value = struct.unpack_from(dyn, data, at)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    out.needed.append(text(value))
                elif tag == _DT_SONAME:
                    out.soname = text(value)
                elif tag == _DT_RUNPATH:
                    out.runpath = [p for p in text(value).split(":") if p]
                elif tag == _DT_RPATH:
                    rpath = [p for p in text(value).split(":") if p]
        out.runpath = out.runpath or rpath
        return out
    except (struct.error, IndexError, ValueError) as exc:
        raise ValueError(f"damaged ELF file: {exc}") from exc


def resolve_needed(library: str | os.PathLike[str], name: str, extra_dirs: list[Path]) -> Path | None:
    """Where ``name`` (a DT_NEEDED entry of ``library``) is found in ``library``'s run-time
    search path (``$ORIGIN`` expanded) or in ``extra_dirs``; None when not there (the
    system's directories are the loader's business)."""
    origin = str(Path(library).resolve().parent)
    dirs = [Path(d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin))
            for d in dynamic_section(library).runpath] + list(extra_dirs)
    for d in dirs:
        candidate = d / name
        if candidate.is_file():
            return candidate
    return None
