from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

from registry.ingest import ArtifactRejected, TensorInfo, read_safetensors_header


def write(tmp_path, data: bytes):
    path = tmp_path / "adapter_model.safetensors"
    path.write_bytes(data)
    return path


def raw(header: dict, data_size: int) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + bytes(data_size)


def raw_text(header: str, data_size: int) -> bytes:
    return struct.pack("<Q", len(header)) + header.encode() + bytes(data_size)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_it_reads_what_safetensors_writes(tmp_path):
    tensors = {
        "a": np.zeros((8, 128), np.float32),
        "b": np.zeros((128, 8), np.float16),
        "c": np.zeros((0,), np.int64),
    }
    path = write(tmp_path, save_safetensors(tensors, metadata={"format": "pt"}))
    assert sorted(read_safetensors_header(path), key=lambda t: t.name) == [
        TensorInfo("a", "F32", (8, 128)),
        TensorInfo("b", "F16", (128, 8)),
        TensorInfo("c", "I64", (0,)),
    ]


BAD = {
    "shorter_than_length_field": b"\x01\x02",
    "length_beyond_file": struct.pack("<Q", 500) + b"{}",
    "zero_length": struct.pack("<Q", 0),
    "not_utf8": struct.pack("<Q", 2) + b"\xff\xfe",
    "not_an_object": raw([], 0),  # type: ignore[arg-type]
    "duplicate_key": raw_text(
        '{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},'
        ' "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
        1,
    ),
    "unknown_dtype": raw({"a": entry("Q4", [1], 0, 1)}, 1),
    "negative_dim": raw({"a": entry("U8", [-1], 0, 0)}, 0),
    "float_dim": raw({"a": entry("U8", [1.0], 0, 1)}, 1),
    "bool_dim": raw({"a": entry("U8", [True], 0, 1)}, 1),
    "wrong_byte_count": raw({"a": entry("F32", [2], 0, 4)}, 4),
    "reversed_offsets": raw({"a": entry("U8", [0], 4, 0)}, 4),
    "gap": raw({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 4, 6)}, 6),
    "overlap": raw({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}, 6),
    "trailing_bytes": raw({"a": entry("U8", [2], 0, 2)}, 3),
    "short_data": raw({"a": entry("U8", [4], 0, 4)}, 2),
    "metadata_not_strings": raw({"__metadata__": {"epoch": 3}}, 0),
    "entry_not_object": raw({"a": [1, 2]}, 0),
}


@pytest.mark.parametrize("data", BAD.values(), ids=BAD.keys())
def test_it_rejects_malformed_headers(data, tmp_path):
    with pytest.raises(ArtifactRejected) as caught:
        read_safetensors_header(write(tmp_path, data))
    assert caught.value.code == "bad_safetensors"
    assert "adapter_model.safetensors" in caught.value.message


def test_it_rejects_a_header_over_the_limit(tmp_path):
    path = write(tmp_path, raw({"a": entry("U8", [1], 0, 1)}, 1))
    with pytest.raises(ArtifactRejected, match="limit"):
        read_safetensors_header(path, max_header_bytes=10)


def test_it_accepts_space_padding_and_empty_files(tmp_path):
    header = json.dumps({"a": entry("U8", [1], 0, 1)}).encode() + b"    "
    path = write(tmp_path, struct.pack("<Q", len(header)) + header + b"\x07")
    assert read_safetensors_header(path) == [TensorInfo("a", "U8", (1,))]
    assert read_safetensors_header(write(tmp_path, raw({}, 0))) == []
