"""Untrusted-artifact ingest: stage an upload safely, then check it is a
servable PEFT LoRA adapter. Staging and validation are pure Python (no
Django, no torch); `sources` names the ways an artifact comes in, and
`streamed` is the Django upload handler that streams one into the store.

Every rejection is an ArtifactRejected with a stable `code`, a human
`message` and an HTTP `status`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .adapter_validation import AdapterMetadata, ModuleShape, inspect_adapter
from .errors import ArtifactRejected
from .safetensors_header import TensorInfo, read_safetensors_header
from .staging import (
    IngestLimits,
    StagedArtifact,
    StagedFile,
    UploadSource,
    clear_directory,
    stage_directory,
    stage_upload,
)

__all__ = [
    "AdapterMetadata",
    "ArtifactRejected",
    "IngestLimits",
    "ModuleShape",
    "StagedArtifact",
    "StagedFile",
    "TensorInfo",
    "UploadSource",
    "clear_directory",
    "inspect_adapter",
    "read_safetensors_header",
    "stage_and_inspect",
    "stage_directory",
    "stage_upload",
]


def stage_and_inspect(
    sources: Sequence[UploadSource],
    dest: Path,
    limits: IngestLimits | None = None,
    serving_dtype: str = "float16",
    allow_pickle: bool = False,
) -> tuple[StagedArtifact, AdapterMetadata]:
    """stage_upload then inspect_adapter; `dest` is left empty if either rejects."""
    staged = stage_upload(sources, dest, limits or IngestLimits())
    try:
        metadata = inspect_adapter(
            staged.root, serving_dtype, allow_pickle, tensor_values=staged.tensor_values
        )
    except BaseException:
        clear_directory(dest)
        raise
    return staged, metadata
