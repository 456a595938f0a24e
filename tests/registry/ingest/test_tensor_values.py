"""TensorValues reads safetensors values as untrusted bytes, fed once, in order,
in chunks of any size, with memory that does not grow with the file."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

from registry.ingest import ArtifactRejected, inspect_adapter
from registry.ingest.tensor_values import TensorValues, read_tensor_values
from tests.support.adapters import AdapterSpec, save_bf16_safetensors, write_adapter_dir


def fed(data: bytes, chunk: int) -> TensorValues:
    values = TensorValues()
    for start in range(0, len(data), chunk):
        values.feed(data[start : start + chunk])
    return values


MIXED = {
    "finite": np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5),
    "zeros16": np.zeros((5, 3), np.float16),
    "nan64": np.array([1.0, np.nan, 2.0], np.float64),
    "ints": np.arange(3, dtype=np.int64),
    "negative_zero": np.full((2, 2), -0.0, np.float32),
    "inf16": np.array([np.inf, 1], np.float16),
}


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 10**6])
def test_it_reports_the_same_whatever_the_chunking(chunk):
    report = fed(save_safetensors(MIXED), chunk).finish()

    assert report is not None
    assert set(report.nonfinite) == {"nan64", "inf16"}
    # Integer tensors are in neither list; -0.0 is zero.
    assert report.all_zero == {"zeros16", "negative_zero"}


def test_bfloat16_is_read_from_its_bits():
    tensors = {
        "nan": np.array([1.0, np.nan], np.float32),
        "inf": np.array([-np.inf, 0.5], np.float32),
        "zero": np.array([0.0, -0.0], np.float32),
        "tiny": np.array([0.0, 1e-30], np.float32),  # tiny is not zero
    }
    report = fed(save_bf16_safetensors(tensors), 3).finish()

    assert report.nonfinite == ("nan", "inf")
    assert report.all_zero == {"zero"}


def test_bytes_it_cannot_follow_give_no_report():
    data = save_safetensors(MIXED)
    for broken in (data[:-1], data + b"x", b"\xff" * 8 + data[8:], data[:20]):
        values = fed(broken, 5)
        assert values.finish() is None
        assert values.unreadable


def test_memory_stays_flat_on_a_large_file(tmp_path):
    # 64 MiB of float32 in one tensor, fed in 1 MiB chunks as staging does.
    path = tmp_path / "big.safetensors"
    path.write_bytes(save_safetensors({"w": np.ones((4096, 4096), np.float32)}))

    tracemalloc.start()
    try:
        report = read_tensor_values(path).finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert report is not None and report.nonfinite == () and report.all_zero == frozenset()
    # The chunk being read plus numpy's temporaries for one 1 MiB window.
    assert peak < 8 * 1024**2, peak


@pytest.mark.parametrize(
    ("poison", "code"),
    [
        ("nan", "non_finite_weights"),
        ("inf", "non_finite_weights"),
        ("-inf", "non_finite_weights"),
        ("zero_b", "adapter_changes_nothing"),
        ("zero_a", "adapter_changes_nothing"),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_inspect_adapter_refuses_hostile_values(poison, code, dtype, tmp_path):
    root = write_adapter_dir(tmp_path, AdapterSpec(poison=poison, dtype=dtype))

    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)

    assert caught.value.code == code
    assert caught.value.status == 400


def test_a_nan_names_the_tensor(tmp_path):
    root = write_adapter_dir(tmp_path, AdapterSpec(poison="nan"))

    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)

    assert "layers.1.self_attn.v_proj.lora_B.weight" in caught.value.message


def test_one_trained_module_is_enough(tmp_path):
    spec = AdapterSpec(poison="zero_b")
    tensors = spec.tensors()
    tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"][0, 0] = 0.5
    root = write_adapter_dir(tmp_path, spec)
    (root / "adapter_model.safetensors").write_bytes(save_safetensors(tensors))

    assert inspect_adapter(root).r == 8


def test_a_scan_of_other_bytes_is_a_wiring_error(tmp_path):
    root = write_adapter_dir(tmp_path, AdapterSpec())
    other = TensorValues()
    other.feed(b"\x00" * 16)

    with pytest.raises(ValueError, match="fed 16 bytes"):
        inspect_adapter(root, tensor_values=other)
