"""Named hostile and malformed artifacts, each with the rejection it must get.

Importable without Django. `build()` returns the upload as a list of
(filename, bytes): one item is a single uploaded file (usually an archive),
several are loose files, none is an empty request. Staging with `limits` and
then inspecting must raise ArtifactRejected(expected_code, status=expected_status)
and store nothing.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from safetensors.numpy import save as save_safetensors

from registry.ingest.staging import IngestLimits
from tests.support.adapters import AdapterSpec, tar_gz_bytes, zip_bytes

Upload = list[tuple[str, bytes]]


@dataclass(frozen=True)
class HostileArtifact:
    name: str
    build: Callable[[], Upload]
    expected_code: str
    expected_status: int = 400
    limits: IngestLimits = field(default_factory=IngestLimits)
    description: str = ""


class ChunkedUpload:
    """The smallest UploadSource: a name and chunks(), not seekable."""

    def __init__(self, name: str, data: bytes) -> None:
        self.name = name
        self.data = data

    def chunks(self, chunk_size: int = 64 * 1024):
        for start in range(0, len(self.data), chunk_size):
            yield self.data[start : start + chunk_size]


def as_sources(upload: Upload) -> list[ChunkedUpload]:
    return [ChunkedUpload(name, data) for name, data in upload]


# --- builders ----------------------------------------------------------------------


def _files(**spec) -> dict[str, bytes]:
    return AdapterSpec(**spec).files()


def _config(**changes) -> bytes:
    config = AdapterSpec().config()
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    return json.dumps(config).encode()


_DROP = object()


def _with_config(**changes) -> Callable[[], Upload]:
    def build() -> Upload:
        files = _files()
        files["adapter_config.json"] = _config(**changes)
        return [("adapter.tar.gz", tar_gz_bytes(files))]

    return build


def _with_tensors(tensors: dict[str, np.ndarray], **config) -> Callable[[], Upload]:
    def build() -> Upload:
        files = {
            "adapter_config.json": _config(**config),
            "adapter_model.safetensors": save_safetensors(tensors),
        }
        return [("adapter.tar.gz", tar_gz_bytes(files))]

    return build


def _with_weights_bytes(weights: bytes) -> Callable[[], Upload]:
    def build() -> Upload:
        files = _files()
        files["adapter_model.safetensors"] = weights
        return [("adapter.tar.gz", tar_gz_bytes(files))]

    return build


def _with_spec(loose: bool = False, **spec) -> Callable[[], Upload]:
    """An AdapterSpec's files as a tar.gz (the staged path) or, `loose`, as loose
    files, which the HTTP API streams straight into the store."""

    def build() -> Upload:
        files = _files(**spec)
        if loose:
            return list(files.items())
        return [("adapter.tar.gz", tar_gz_bytes(files))]

    return build


# A module path on which a nested quantifier backtracks: Python's re needs
# about 2**40 steps to find that (a+)+ does not match it; RE2 answers at once.
REDOS_PATH = "a" * 40 + "!"
REDOS_Q = f"base_model.model.{REDOS_PATH}"


def _tar(*members: tuple[tarfile.TarInfo, bytes], gz: bool = True) -> bytes:
    buffer = io.BytesIO()
    mode = "w:gz" if gz else "w"
    with tarfile.open(
        fileobj=buffer,
        mode=mode,
        format=tarfile.GNU_FORMAT,
        encoding="utf-8",
        errors="surrogateescape",
    ) as archive:
        for info, data in members:
            if info.isreg():
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, **attrs) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def _adapter_tar_plus(info: tarfile.TarInfo, data: bytes = b"") -> Callable[[], Upload]:
    """A valid adapter archive with one hostile entry added first."""

    def build() -> Upload:
        members = [(info, data)]
        members += [(_member(n), d) for n, d in _files().items()]
        return [("adapter.tar.gz", _tar(*members))]

    return build


def _zip_with(name: str, data: bytes = b"x", external_attr: int = 0):
    def build() -> Upload:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            info = zipfile.ZipInfo(name)
            info.external_attr = external_attr
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
            for n, d in _files().items():
                archive.writestr(n, d)
        return [("adapter.zip", buffer.getvalue())]

    return build


def _encrypted_zip() -> Upload:
    # zipfile cannot write encrypted entries, so set the "encrypted" flag bit
    # by hand in the first entry's local and central headers.
    data = bytearray(_zip_with("secret.txt", b"x")()[0][1])
    for signature, flag_offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.index(signature) + flag_offset
        data[at] |= 0x1
    return [("adapter.zip", bytes(data))]


def _zip_bomb() -> Upload:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("adapter_model.safetensors", bytes(32 * 1024**2))
    return [("adapter.zip", buffer.getvalue())]


def _tar_gz_bomb() -> Upload:
    return [("adapter.tar.gz", tar_gz_bytes({"adapter_model.safetensors": bytes(32 * 1024**2)}))]


def _lora(prefix: str, r: int, fan_in: int = 128, fan_out: int = 128) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.lora_A.weight": np.ones((r, fan_in), np.float32),
        f"{prefix}.lora_B.weight": np.ones((fan_out, r), np.float32),
    }


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"
V0 = "base_model.model.model.layers.0.self_attn.v_proj"


def _header_only(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


# --- the corpus --------------------------------------------------------------------

HOSTILE_ARTIFACTS: list[HostileArtifact] = [
    # Archive structure
    HostileArtifact(
        "tar_path_traversal",
        _adapter_tar_plus(_member("../evil.sh"), b"echo pwned"),
        "path_traversal",
        description="tar entry '../evil.sh' escapes the staging folder",
    ),
    HostileArtifact(
        "tar_nested_traversal",
        _adapter_tar_plus(_member("adapter/../../etc/cron.d/x"), b"x"),
        "path_traversal",
        description="traversal hidden behind a normal-looking folder",
    ),
    HostileArtifact(
        "zip_path_traversal",
        _zip_with("../../evil.sh", b"echo pwned"),
        "path_traversal",
        description="zip-slip",
    ),
    HostileArtifact(
        "tar_absolute_path",
        _adapter_tar_plus(_member("/etc/passwd"), b"root::0:0"),
        "absolute_path",
    ),
    HostileArtifact(
        "zip_absolute_path",
        _zip_with("/tmp/evil.sh", b"x"),
        "absolute_path",
    ),
    HostileArtifact(
        "zip_backslash_traversal",
        _zip_with("..\\..\\evil.bat", b"x"),
        "windows_path",
        description="Windows-style traversal with backslashes",
    ),
    HostileArtifact(
        "tar_drive_letter",
        _adapter_tar_plus(_member("C:/Windows/evil.dll"), b"x"),
        "windows_path",
    ),
    HostileArtifact(
        "tar_symlink",
        _adapter_tar_plus(_member("link.json", tarfile.SYMTYPE, linkname="/etc/passwd")),
        "symlink",
    ),
    HostileArtifact(
        "zip_symlink",
        _zip_with("link.json", b"/etc/passwd", external_attr=(0o120777 << 16)),
        "symlink",
        description="zip entry whose Unix mode marks it a symbolic link",
    ),
    HostileArtifact(
        "tar_hardlink",
        _adapter_tar_plus(_member("link.json", tarfile.LNKTYPE, linkname="/etc/shadow")),
        "hardlink",
    ),
    HostileArtifact(
        "tar_char_device",
        _adapter_tar_plus(_member("null", tarfile.CHRTYPE, devmajor=1, devminor=3)),
        "special_file",
    ),
    HostileArtifact(
        "tar_fifo",
        _adapter_tar_plus(_member("pipe", tarfile.FIFOTYPE)),
        "special_file",
    ),
    HostileArtifact(
        "tar_non_utf8_name",
        _adapter_tar_plus(_member("caf\udce9.json"), b"{}"),
        "non_utf8_name",
        description="a Latin-1 byte (0xE9) in the raw tar name",
    ),
    HostileArtifact(
        "tar_control_character_name",
        _adapter_tar_plus(_member("evil\n.json"), b"{}"),
        "unsafe_name",
    ),
    HostileArtifact(
        "tar_duplicate_names",
        lambda: [
            (
                "adapter.tar.gz",
                _tar(
                    *[(_member(n), d) for n, d in _files().items()],
                    (_member("adapter_config.json"), b'{"peft_type": "LORA"}'),
                ),
            )
        ],
        "duplicate_entry",
        description="a second adapter_config.json would silently replace the first",
    ),
    HostileArtifact(
        "loose_duplicate_names",
        lambda: [
            ("adapter_config.json", _config()),
            ("adapter_config.json", _config(r=4)),
            ("adapter_model.safetensors", _files()["adapter_model.safetensors"]),
        ],
        "duplicate_entry",
    ),
    HostileArtifact(
        "loose_traversal_name",
        lambda: [("..", b"x"), ("adapter_config.json", _config())],
        "path_traversal",
    ),
    HostileArtifact(
        "nested_subdirectory",
        lambda: [
            (
                "adapter.tar.gz",
                tar_gz_bytes(
                    {f"adapter/{n}": d for n, d in _files().items()} | {"adapter/sub/x.txt": b"x"}
                ),
            )
        ],
        "nested_directory",
    ),
    HostileArtifact(
        "zip_bomb",
        _zip_bomb,
        "compression_bomb",
        413,
        description="32 MiB of zeros deflated to ~32 KiB",
    ),
    HostileArtifact(
        "tar_gz_bomb",
        _tar_gz_bomb,
        "compression_bomb",
        413,
        description="caught while streaming, before the whole file is written",
    ),
    HostileArtifact(
        "too_many_entries",
        lambda: [("adapter.tar.gz", tar_gz_bytes({f"f{i}.txt": b"x" for i in range(5)}))],
        "too_many_entries",
        413,
        limits=IngestLimits(max_entries=4),
    ),
    HostileArtifact(
        "zip_too_many_entries",
        lambda: [("adapter.zip", zip_bytes({f"f{i}.txt": b"x" for i in range(65)}))],
        "too_many_entries",
        413,
        description="refused from the zip end record, before the directory is parsed",
    ),
    HostileArtifact(
        "tar_huge_long_name_header",
        lambda: [("adapter.tar.gz", _tar((_member("a" * 200_000), b"x")))],
        "oversized_tar_header",
        413,
        description="a 200 KB GNU long-name header tarfile would read whole into memory",
    ),
    HostileArtifact(
        "over_total_size",
        lambda: [("adapter.tar.gz", tar_gz_bytes(_files()))],
        "upload_too_large",
        413,
        limits=IngestLimits(max_total_bytes=16 * 1024),
        description="a normal 34 KB adapter against a 16 KiB total limit",
    ),
    HostileArtifact(
        "over_file_size",
        lambda: [("adapter.zip", zip_bytes(_files()))],
        "file_too_large",
        413,
        limits=IngestLimits(max_file_bytes=16 * 1024),
    ),
    HostileArtifact(
        "truncated_tar_gz",
        lambda: [("adapter.tar.gz", tar_gz_bytes(_files())[:5000])],
        "corrupt_archive",
    ),
    HostileArtifact(
        "encrypted_zip",
        _encrypted_zip,
        "encrypted_archive",
    ),
    HostileArtifact(
        "unsupported_archive_type",
        lambda: [("adapter.7z", b"7z\xbc\xaf\x27\x1c" + bytes(100))],
        "unsupported_upload_type",
        415,
    ),
    HostileArtifact(
        "fake_tar_gz_name",
        lambda: [("adapter.tar.gz", b"this is not an archive at all")],
        "unsupported_upload_type",
        415,
        description="named like an archive, but the magic bytes say otherwise",
    ),
    HostileArtifact("empty_file", lambda: [("adapter.tar.gz", b"")], "empty_upload"),
    HostileArtifact("no_files", lambda: [], "empty_upload"),
    HostileArtifact(
        "empty_archive", lambda: [("adapter.tar.gz", tar_gz_bytes({}))], "empty_upload"
    ),
    # Files
    HostileArtifact(
        "pickle_bin_weights",
        lambda: [
            ("adapter_config.json", _config()),
            ("adapter_model.bin", b"\x80\x04cos\nsystem\n(S'echo pwned'\ntR."),
        ],
        "pickle_weights",
        description="a pickle that would run a shell command if unpickled",
    ),
    HostileArtifact(
        "pickle_pt_weights",
        lambda: [
            (
                "adapter.tar.gz",
                tar_gz_bytes({"adapter_config.json": _config(), "adapter_model.pt": b"PK"}),
            )
        ],
        "pickle_weights",
    ),
    HostileArtifact(
        "pickle_next_to_safetensors",
        lambda: [("adapter.tar.gz", tar_gz_bytes(_files() | {"training_args.bin": b"\x80\x04."}))],
        "pickle_weights",
    ),
    HostileArtifact(
        "missing_config",
        lambda: [("adapter_model.safetensors", _files()["adapter_model.safetensors"])],
        "missing_config",
    ),
    HostileArtifact(
        "missing_weights",
        lambda: [("adapter_config.json", _config())],
        "missing_weights",
    ),
    HostileArtifact(
        "full_model_weights",
        lambda: [
            ("adapter_config.json", _config()),
            ("model.safetensors", _files()["adapter_model.safetensors"]),
        ],
        "missing_weights",
    ),
    HostileArtifact(
        "unexpected_executable_file",
        lambda: [("adapter.tar.gz", tar_gz_bytes(_files() | {"setup.py": b"import os"}))],
        "unexpected_file",
    ),
    # adapter_config.json
    HostileArtifact(
        "config_not_json",
        lambda: [
            ("adapter.tar.gz", tar_gz_bytes(_files() | {"adapter_config.json": b"{r: 8,"})),
        ],
        "invalid_config",
    ),
    HostileArtifact(
        "config_is_a_list",
        lambda: [("adapter.tar.gz", tar_gz_bytes(_files() | {"adapter_config.json": b"[]"}))],
        "invalid_config",
    ),
    HostileArtifact("peft_type_ia3", _with_config(peft_type="IA3"), "unsupported_peft_type"),
    HostileArtifact("rank_zero", _with_config(r=0), "invalid_rank"),
    HostileArtifact("rank_is_string", _with_config(r="8"), "invalid_rank"),
    HostileArtifact("rank_is_bool", _with_config(r=True), "invalid_rank"),
    HostileArtifact("missing_lora_alpha", _with_config(lora_alpha=_DROP), "missing_lora_alpha"),
    HostileArtifact(
        "missing_target_modules", _with_config(target_modules=_DROP), "missing_target_modules"
    ),
    HostileArtifact("dora", _with_config(use_dora=True), "dora_unsupported"),
    HostileArtifact("bias_all", _with_config(bias="all"), "bias_unsupported"),
    HostileArtifact(
        "modules_to_save_lm_head",
        _with_config(modules_to_save=["lm_head"]),
        "modules_to_save_unsupported",
    ),
    # adapter_model.safetensors
    HostileArtifact(
        "header_length_beyond_file",
        _with_weights_bytes(struct.pack("<Q", 10_000) + b"{}"),
        "bad_safetensors",
    ),
    HostileArtifact(
        "header_not_json",
        _with_weights_bytes(struct.pack("<Q", 6) + b"{nope}"),
        "bad_safetensors",
    ),
    HostileArtifact(
        "header_bad_offsets",
        _with_weights_bytes(
            _header_only(
                {
                    f"{Q0}.lora_A.weight": {
                        "dtype": "F32",
                        "shape": [8, 128],
                        "data_offsets": [0, 4096],
                    },
                    f"{Q0}.lora_B.weight": {
                        "dtype": "F32",
                        "shape": [128, 8],
                        "data_offsets": [2048, 6144],
                    },
                },
                bytes(6144),
            )
        ),
        "bad_safetensors",
        description="two tensors share bytes 2048-4096",
    ),
    HostileArtifact(
        "header_unknown_dtype",
        _with_weights_bytes(
            _header_only(
                {f"{Q0}.lora_A.weight": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}},
                bytes(16),
            )
        ),
        "bad_safetensors",
    ),
    HostileArtifact(
        "base_model_weight",
        _with_tensors(
            _lora(Q0, 8)
            | _lora(V0, 8)
            | {
                "base_model.model.model.layers.0.self_attn.q_proj.weight": np.ones(
                    (128, 128), np.float32
                )
            }
        ),
        "unexpected_tensor",
        description="a full base-model weight smuggled in with the LoRA weights",
    ),
    HostileArtifact(
        "dora_magnitude_vector",
        _with_tensors(
            _lora(Q0, 8)
            | _lora(V0, 8)
            | {f"{Q0}.lora_magnitude_vector": np.ones((1, 128), np.float32)}
        ),
        "unexpected_tensor",
    ),
    HostileArtifact(
        "rank_differs_from_r",
        _with_config(r=16),
        "rank_mismatch",
        description="config says r=16, the weights have rank 8",
    ),
    HostileArtifact(
        "a_b_rank_disagree",
        _with_tensors(
            {
                f"{Q0}.lora_A.weight": np.ones((8, 128), np.float32),
                f"{Q0}.lora_B.weight": np.ones((128, 4), np.float32),
            }
            | _lora(V0, 8)
        ),
        "rank_mismatch",
    ),
    HostileArtifact(
        "rank_pattern_mismatch",
        _with_config(rank_pattern={"q_proj": 4}),
        "rank_mismatch",
        description="rank_pattern says q_proj has rank 4, the weights have 8",
    ),
    HostileArtifact(
        "module_not_in_target_modules",
        _with_config(target_modules=["q_proj"]),
        "target_modules_mismatch",
    ),
    # Not here: target_modules naming a module without tensors. PEFT writes that
    # for exclude_modules and layers_to_transform, and vLLM serves it exactly like
    # PEFT (tests/conformance, "exclude_modules"); test_adapter_validation accepts it.
    HostileArtifact(
        "missing_lora_b",
        _with_tensors(_lora(V0, 8) | {f"{Q0}.lora_A.weight": np.ones((8, 128), np.float32)}),
        "incomplete_lora_pair",
    ),
    HostileArtifact(
        "three_d_lora_tensor",
        _with_tensors(
            {
                f"{Q0}.lora_A.weight": np.ones((8, 128, 1), np.float32),
                f"{Q0}.lora_B.weight": np.ones((128, 8), np.float32),
            }
            | _lora(V0, 8)
        ),
        "invalid_lora_shape",
    ),
    HostileArtifact(
        "integer_weights",
        _with_tensors({k: v.astype(np.int8) for k, v in (_lora(Q0, 8) | _lora(V0, 8)).items()}),
        "unsupported_dtype",
    ),
    HostileArtifact(
        "no_tensors",
        _with_weights_bytes(_header_only({}, b"")),
        "no_lora_tensors",
    ),
    # Untrusted regexes (issue 14): linear-time matching, a 400 naming the key
    HostileArtifact(
        "redos_target_modules",
        _with_tensors(_lora(REDOS_Q, 8), target_modules="(a+)+"),
        "target_modules_mismatch",
        description="(a+)+ against 'aaa…a!' pinned the web process with Python's re",
    ),
    HostileArtifact(
        "redos_rank_pattern_key",
        _with_tensors(_lora(REDOS_Q, 4), target_modules=[REDOS_PATH], rank_pattern={"(a+)+": 4}),
        "rank_mismatch",
        description="the key does not match the module, so its rank-4 weights contradict r = 8",
    ),
    HostileArtifact(
        "lookahead_target_modules",
        _with_config(target_modules="(?=.*q_proj).*"),
        "invalid_target_modules",
        description="lookaround needs backtracking; RE2 refuses it",
    ),
    HostileArtifact(
        "backreference_rank_pattern_key",
        _with_config(rank_pattern={r"(q)\1_proj": 8}),
        "invalid_rank_pattern",
    ),
    HostileArtifact(
        "invalid_alpha_pattern_key",
        _with_config(alpha_pattern={"q_proj(": 32}),
        "invalid_alpha_pattern",
    ),
    HostileArtifact(
        "overlong_target_modules_regex",
        _with_config(target_modules="(q_proj|v_proj)" + "?" * 5000),
        "invalid_target_modules",
    ),
    # Tensor values (issue 14): read as untrusted bytes while they stream past
    HostileArtifact("nan_in_lora_b", _with_spec(poison="nan"), "non_finite_weights"),
    HostileArtifact(
        "nan_in_lora_b_streamed",
        _with_spec(loose=True, poison="nan"),
        "non_finite_weights",
        description="loose files: over HTTP they stream into the store, never staged",
    ),
    HostileArtifact(
        "inf_in_lora_a_float16", _with_spec(poison="-inf", dtype="float16"), "non_finite_weights"
    ),
    HostileArtifact(
        "inf_in_lora_b_bfloat16_streamed",
        _with_spec(loose=True, poison="inf", dtype="bfloat16"),
        "non_finite_weights",
    ),
    HostileArtifact(
        "nan_in_lora_b_float64", _with_spec(poison="nan", dtype="float64"), "non_finite_weights"
    ),
    HostileArtifact(
        "untrained_zero_lora_b",
        _with_spec(poison="zero_b"),
        "adapter_changes_nothing",
        description="PEFT's initial lora_B; vLLM serves exactly the base model's output",
    ),
    HostileArtifact(
        "untrained_zero_lora_b_bfloat16_streamed",
        _with_spec(loose=True, poison="zero_b", dtype="bfloat16"),
        "adapter_changes_nothing",
    ),
    HostileArtifact("zero_lora_a", _with_spec(poison="zero_a"), "adapter_changes_nothing"),
    # PEFT initialisations that rewrite the base model's weights, saved unconverted
    HostileArtifact("init_pissa", _with_config(init_lora_weights="pissa"), "base_modifying_init"),
    HostileArtifact(
        "init_pissa_niter",
        _with_config(init_lora_weights="pissa_niter_16"),
        "base_modifying_init",
    ),
    HostileArtifact("init_olora", _with_config(init_lora_weights="olora"), "base_modifying_init"),
    HostileArtifact("init_corda", _with_config(init_lora_weights="corda"), "base_modifying_init"),
    HostileArtifact("init_loftq", _with_config(init_lora_weights="loftq"), "base_modifying_init"),
]
