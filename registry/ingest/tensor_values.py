"""Read a safetensors file's tensor values as untrusted bytes, once, as they arrive.

vLLM checks little of an adapter's contents: an
adapter with NaN or Inf in its weights loads and then breaks every completion
that uses it, and one whose every lora_B is zero loads and serves exactly the
base model's output. The header says nothing about either, so the values are
read, without torch.

`TensorValues` is fed the file's bytes in order, from byte 0, in chunks of any
size (`feed`), and `finish()` reports what it saw. It keeps no tensor in
memory: only the JSON header, at most one element split across two chunks,
and per-tensor flags. This lets both ingest paths check the bytes on their one
pass over them: the staging copy (.staging) and the upload streamed straight
into the store, whose local copy holds only the header (.streamed).

The report is facts about values; which facts refuse an adapter is
adapter_validation's rule, applied after the structure has been checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ArtifactRejected
from .safetensors_header import MAX_HEADER_BYTES, TensorInfo, header_length, parse_header

# Little-endian, as safetensors stores them. BF16 has no numpy dtype: its bits
# are read as uint16 (sign 1, exponent 8, mantissa 7).
FLOAT_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
}
BF16 = "BF16"
BF16_EXPONENT = 0x7F80  # all ones: Inf or NaN
BF16_MAGNITUDE = 0x7FFF  # everything but the sign: zero means +0 or -0
ITEM_SIZES = {"F64": 8, "F32": 4, "F16": 2, BF16: 2}
# Values are inspected this many bytes at a time, however large a fed chunk is,
# so the temporary arrays numpy makes stay small.
WINDOW_BYTES = 1024 * 1024


@dataclass(frozen=True)
class TensorValueReport:
    """What the values were. `nonfinite` and `all_zero` hold tensor names, in
    file order; tensors of other dtypes (integers) are in neither."""

    size: int  # bytes fed, the whole file
    nonfinite: tuple[str, ...]
    all_zero: frozenset[str]


class TensorValues:
    def __init__(self, name: str = "adapter_model.safetensors"):
        self.path = Path(name)  # only for messages
        self.size = 0
        self._head = bytearray()
        self._data_start: int | None = None
        self._tensors: list[TensorInfo] = []
        self._index = 0  # the tensor the next data byte belongs to
        self._data_fed = 0  # bytes of the data section seen so far
        self._carry = b""  # the start of an element split across chunks
        self._nonzero: set[str] = set()
        self._nonfinite: list[str] = []
        self._nonfinite_seen: set[str] = set()
        # Set when the bytes are not a safetensors file this can follow; the
        # header check refuses such a file with its own, better message.
        self.unreadable: str | None = None

    def feed(self, chunk: bytes | memoryview) -> None:
        view = memoryview(chunk).cast("B")
        self.size += len(view)
        if self.unreadable is not None:
            return
        if self._data_start is None:
            view = self._take_header(view)
            if self._data_start is None:
                return
        while view and self.unreadable is None:
            window, view = view[:WINDOW_BYTES], view[WINDOW_BYTES:]
            self._take_data(window)

    def finish(self) -> TensorValueReport | None:
        """The report, or None if the bytes could not be followed (see `unreadable`)."""
        if self.unreadable is None:
            if self._data_start is None:
                self.unreadable = "the file ends inside its header"
            elif self._index < len(self._tensors) or self._carry:
                self.unreadable = "the file ends before its last tensor"
        if self.unreadable is not None:
            return None
        zero = frozenset(
            t.name for t in self._tensors if t.dtype in ITEM_SIZES and t.name not in self._nonzero
        )
        return TensorValueReport(self.size, tuple(self._nonfinite), zero)

    # --- internals ------------------------------------------------------------------

    def _take_header(self, view: memoryview) -> memoryview:
        wanted = 8
        if len(self._head) >= 8:
            wanted = 8 + int.from_bytes(self._head[:8], "little")
        while view and len(self._head) < wanted:
            piece = view[: wanted - len(self._head)]
            self._head += piece
            view = view[len(piece) :]
            if len(self._head) == 8:
                try:
                    wanted = 8 + header_length(self.path, bytes(self._head), MAX_HEADER_BYTES)
                except ArtifactRejected as rejection:
                    self.unreadable = rejection.message
                    return memoryview(b"")
        if len(self._head) < wanted or wanted == 8:
            return view
        try:
            tensors = parse_header(self.path, bytes(self._head[8:]))
        except ArtifactRejected as rejection:
            self.unreadable = rejection.message
            return memoryview(b"")
        self._head = bytearray()  # the header can be large; it is not needed again
        self._tensors = sorted(tensors, key=lambda t: (t.begin, t.end, t.name))
        # Data is followed tensor by tensor, so the spans must tile the data
        # section as read_safetensors_header requires; anything else is refused there.
        position = 0
        for tensor in self._tensors:
            if tensor.begin != position:
                self.unreadable = f"tensor {tensor.name!r} does not start where the previous ends"
                return memoryview(b"")
            position = tensor.end
        self._data_start = wanted
        self._skip_empty()
        return view

    def _skip_empty(self) -> None:
        while self._index < len(self._tensors) and (
            self._tensors[self._index].begin == self._tensors[self._index].end
        ):
            self._index += 1

    def _take_data(self, view: memoryview) -> None:
        while view:
            if self._index >= len(self._tensors):
                self.unreadable = "the file has bytes after its last tensor"
                return
            tensor = self._tensors[self._index]
            take = min(len(view), tensor.end - self._data_fed)
            self._inspect(tensor, view[:take])
            view = view[take:]
            self._data_fed += take
            if self._data_fed == tensor.end:
                if self._carry:
                    self.unreadable = f"tensor {tensor.name!r} ends inside an element"
                    return
                self._index += 1
                self._skip_empty()

    def _inspect(self, tensor: TensorInfo, data: memoryview) -> None:
        item = ITEM_SIZES.get(tensor.dtype)
        if item is None:
            return  # integer tensors are refused by dtype elsewhere, not by value
        if self._carry:
            joined = self._carry + bytes(data[: item - len(self._carry)])
            data = data[item - len(self._carry) :]
            self._carry = b""
            if len(joined) < item:
                self._carry = joined
                return
            self._check(tensor, joined)
        whole = len(data) - len(data) % item
        if whole:
            self._check(tensor, data[:whole])
        if whole < len(data):
            self._carry = bytes(data[whole:])

    def _check(self, tensor: TensorInfo, data) -> None:
        if tensor.dtype == BF16:
            bits = np.frombuffer(data, dtype="<u2")
            finite = not np.any((bits & BF16_EXPONENT) == BF16_EXPONENT)
            nonzero = tensor.name in self._nonzero or bool(np.any(bits & BF16_MAGNITUDE))
        else:
            values = np.frombuffer(data, dtype=FLOAT_DTYPES[tensor.dtype])
            finite = bool(np.isfinite(values).all())
            # NaN compares unequal to zero, so a NaN tensor is "nonzero" here;
            # it is refused as non-finite anyway.
            nonzero = tensor.name in self._nonzero or bool(np.any(values != 0))
        if not finite and tensor.name not in self._nonfinite_seen:
            self._nonfinite_seen.add(tensor.name)
            self._nonfinite.append(tensor.name)
        if nonzero:
            self._nonzero.add(tensor.name)


def read_tensor_values(path: Path, chunk_size: int = 1024 * 1024) -> TensorValues:
    """Feed a whole file from disk, for callers that have it there (tests, folders)."""
    values = TensorValues(Path(path).name)
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            values.feed(chunk)
    return values
