"""Weights a simplify pass made, held as arrays while ``graphkit simplify`` splices its output
(graphkit.rewrite.simplify._splice).

Such an initializer is external data of the model's own file at an offset past its end: the
passes and the rules read its value from here (:func:`held_value`), and the splice writes its
bytes from the array. A folded weight is then never copied into a TensorProto, serialized
with the model and cut out of those bytes again. Outside :func:`holding` nothing is held.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import onnx
from onnx import helper

__all__ = ["PLAIN_TYPES", "HeldWeights", "held", "held_value", "holding", "plain"]

_EXTERNAL = onnx.TensorProto.EXTERNAL
PLAIN_TYPES = {t: helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.bool_)}  # numpy types whose TensorProto (numpy_helper.from_array) is their raw bytes


def plain(value: np.ndarray) -> bool:
    """Whether ``value``'s raw_data is its own bytes, as they are in memory."""
    return value.dtype.type in PLAIN_TYPES and value.dtype.isnative and sys.byteorder == "little"


class HeldWeights:
    """Arrays of ``min_bytes`` or more, referred to as external data of ``location`` at
    offsets from ``start`` on (``start``: the file's size, so no weight of it is there)."""

    def __init__(self, location: str, start: int, min_bytes: int) -> None:
        self.location = location
        self.start = start
        self.min_bytes = min_bytes
        self._next = start
        self._arrays: dict[int, np.ndarray] = {}

    def hold(self, tensor: onnx.TensorProto, value: np.ndarray, name: str) -> bool:
        """Make the empty ``tensor`` a reference to ``value`` named ``name``; False (nothing
        done) where ``value`` is small or not a plain numeric array."""
        if value.nbytes < self.min_bytes or not plain(value) or not value.flags.c_contiguous:
            return False
        value = value.view()
        value.flags.writeable = False  # (the bytes written later are these)
        offset = self._next
        self._next += value.nbytes
        self._arrays[offset] = value
        tensor.dims.extend(value.shape)
        tensor.data_type = PLAIN_TYPES[value.dtype.type]
        tensor.name = name
        for key, v in (("location", self.location), ("offset", str(offset)), ("length", str(value.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, v
        tensor.data_location = _EXTERNAL
        return True

    def array(self, tensor: onnx.TensorProto) -> np.ndarray | None:
        """The array ``tensor`` refers to, or None where it is not one held here."""
        if tensor.data_location != _EXTERNAL:
            return None
        info = {e.key: e.value for e in tensor.external_data}
        if info.get("location") != self.location:
            return None
        try:
            offset = int(info.get("offset", "-1"))
        except ValueError:
            return None
        got = self._arrays.get(offset)
        return got if got is not None and info.get("length") == str(got.nbytes) else None

    def data(self, offset: int, length: int) -> memoryview | None:
        """The bytes at ``offset`` (a reference's), or None where none are held there."""
        got = self._arrays.get(offset)
        return memoryview(got).cast("B") if got is not None and got.nbytes == length else None


_HELD: ContextVar[HeldWeights | None] = ContextVar("graphkit_held_weights", default=None)


@contextmanager
def holding(weights: HeldWeights) -> Iterator[HeldWeights]:
    """New large initializers made within are held in ``weights``."""
    token = _HELD.set(weights)
    try:
        yield weights
    finally:
        _HELD.reset(token)


def held() -> HeldWeights | None:
    """The weights of the :func:`holding` around this call, if any."""
    return _HELD.get()


def held_value(tensor: onnx.TensorProto) -> np.ndarray | None:
    """The array an initializer held by :func:`holding` refers to; None for any other."""
    weights = _HELD.get()
    return None if weights is None else weights.array(tensor)
