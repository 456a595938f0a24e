"""Read and check a .safetensors header without torch or the safetensors package.

The format is an 8-byte little-endian header length, a JSON header, then the
raw tensor bytes. Only the header is read here: the data section is checked by
arithmetic (every byte belongs to exactly one tensor). The values themselves
are read, streaming, by .tensor_values.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ArtifactRejected

DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


# read_safetensors_header's default cap on the JSON header.
MAX_HEADER_BYTES = 100 * 1024**2


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    # Byte range in the data section (after the 8-byte length and the header).
    begin: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _bad(path: Path, problem: str) -> ArtifactRejected:
    return ArtifactRejected(
        "bad_safetensors",
        f"{path.name} is not a valid safetensors file: {problem}. Save it again with "
        "safetensors.torch.save_file or PEFT save_pretrained(safe_serialization=True).",
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def header_length(path: Path, prefix: bytes, max_header_bytes: int = MAX_HEADER_BYTES) -> int:
    """The JSON header's length from the file's first 8 bytes, within the cap."""
    if len(prefix) < 8:
        raise _bad(path, "the file is shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len < 2:
        raise _bad(path, f"the header length ({header_len}) is too small")
    if header_len > max_header_bytes:
        raise _bad(
            path,
            f"the header length ({header_len} bytes) is over the {max_header_bytes} limit",
        )
    return header_len


def read_safetensors_header(
    path: Path, max_header_bytes: int = MAX_HEADER_BYTES
) -> list[TensorInfo]:
    path = Path(path)
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        header_len = header_length(path, handle.read(8), max_header_bytes)
        if 8 + header_len > file_size:
            raise _bad(
                path,
                f"the header length ({header_len} bytes) runs past the end of the "
                f"{file_size}-byte file",
            )
        raw = handle.read(header_len)
    tensors = parse_header(path, raw)
    data_size = file_size - 8 - header_len
    # Every byte of the data section must belong to exactly one tensor.
    position = 0
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end, t.name)):
        if tensor.begin != position:
            overlaps = tensor.begin < position
            problem = "overlaps another tensor" if overlaps else "leaves a gap before it"
            raise _bad(path, f"tensor {tensor.name!r} at offset {tensor.begin} {problem}")
        position = tensor.end
    if position != data_size:
        raise _bad(
            path,
            f"the tensors cover {position} bytes but the data section is {data_size} bytes",
        )
    return tensors


def parse_header(path: Path, raw: bytes) -> list[TensorInfo]:
    """The tensors a JSON header declares, each checked on its own (dtype, shape,
    a byte span that fits them). How the spans tile the file is the caller's."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise _bad(path, f"the header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise _bad(path, "the header is not a JSON object")

    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise _bad(path, "__metadata__ must map strings to strings")

    tensors: list[TensorInfo] = []
    for name, entry in header.items():
        if not name:
            raise _bad(path, "a tensor has an empty name")
        if not isinstance(entry, dict):
            raise _bad(path, f"the entry for tensor {name!r} is not an object")
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _bad(path, f"tensor {name!r} has an invalid shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if offsets[1] - offsets[0] != expected:
            raise _bad(
                path,
                f"tensor {name!r} ({dtype} {shape}) needs {expected} bytes but its "
                f"data_offsets span {offsets[1] - offsets[0]}",
            )
        tensors.append(TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1]))
    return tensors
