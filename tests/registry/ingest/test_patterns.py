"""The regexes an adapter_config.json carries are matched in linear time (RE2).

Python's re needs ~2**40 steps to find that `(a+)+` does not fully match 40
a's and a "!", and holds the GIL all along: the web process stopped answering.
The timing test runs the check in a child process, so on a backtracking
matcher it fails by timeout instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from registry.ingest import ArtifactRejected, inspect_adapter
from registry.ingest.patterns import MAX_PATTERN_CHARS, MAX_PATTERN_KEYS, PatternKeys
from tests.support.adapters import AdapterSpec, write_adapter_dir

ROOT = Path(__file__).resolve().parents[3]
LONG_NAME = "a" * 40 + "!"

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from safetensors.numpy import save
    from registry.ingest import ArtifactRejected, inspect_adapter
    from tests.support.adapters import AdapterSpec, write_adapter_dir
    from pathlib import Path

    config, module, rank = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    root = write_adapter_dir(Path(sys.argv[4]), AdapterSpec(extra_config=config))
    prefix = "base_model.model." + module
    (root / "adapter_model.safetensors").write_bytes(save({
        prefix + ".lora_A.weight": np.ones((rank, 128), np.float32),
        prefix + ".lora_B.weight": np.ones((128, rank), np.float32),
    }))
    # CPU time, not wall time: backtracking is CPU, and the light run (niced
    # beside vLLM) may wait seconds for a CPU that a linear match hardly uses.
    started = time.process_time()
    try:
        inspect_adapter(root)
        code = "accepted"
    except ArtifactRejected as rejection:
        code = rejection.code
    print(json.dumps({"code": code, "seconds": time.process_time() - started}))
    """
)


def _inspect_in_child(tmp_path, config: dict, module: str, rank: int = 8) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(config), module, str(rank), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # Generous: the child's imports take a second or two on a busy machine.
        # A backtracking matcher would run for hours.
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("config", "rank", "code"),
    [
        ({"target_modules": "(a+)+"}, 8, "target_modules_mismatch"),
        ({"target_modules": [LONG_NAME], "rank_pattern": {"(a+)+": 4}}, 4, "rank_mismatch"),
        ({"target_modules": "(a|aa)*c"}, 8, "target_modules_mismatch"),
    ],
    ids=["target_modules", "rank_pattern_key", "alternation"],
)
def test_a_crafted_pattern_is_answered_in_under_a_second(tmp_path, config, rank, code):
    result = _inspect_in_child(tmp_path, config, LONG_NAME, rank)

    assert result["code"] == code
    assert result["seconds"] < 1.0, result


def test_rank_pattern_keeps_peft_semantics(tmp_path):
    # First key in config order wins; a key matches at a dot boundary of the path's end.
    keys = PatternKeys("rank_pattern", [r"layers\.0\.self_attn\.q_proj", "q_proj", "proj"])

    assert keys.first_match("model.layers.0.self_attn.q_proj") == r"layers\.0\.self_attn\.q_proj"
    assert keys.first_match("model.layers.1.self_attn.q_proj") == "q_proj"
    assert keys.first_match("model.layers.1.self_attn.v_proj") is None  # "proj" is not "v_proj"
    assert keys.first_match("model.layers.1.mlp.proj") == "proj"


def test_a_regex_rank_pattern_still_sets_ranks(tmp_path):
    spec = AdapterSpec(target_modules=["q_proj", "v_proj"], extra_config={})
    spec.extra_config["rank_pattern"] = {r".*\.v_proj": 4}
    tensors = spec.tensors()
    for name in list(tensors):
        if ".v_proj." in name:
            shape = (4, 128) if "lora_A" in name else (128, 4)
            tensors[name] = tensors[name][: shape[0], : shape[1]].copy()
    root = write_adapter_dir(tmp_path, spec)
    from safetensors.numpy import save

    (root / "adapter_model.safetensors").write_bytes(save(tensors))

    assert inspect_adapter(root).rank_pattern == {r".*\.v_proj": 4}


@pytest.mark.parametrize(
    ("config", "code", "named"),
    [
        ({"target_modules": "(?=.*q_proj).*"}, "invalid_target_modules", "target_modules"),
        ({"target_modules": "x" * (MAX_PATTERN_CHARS + 1)}, "invalid_target_modules", "2049"),
        ({"rank_pattern": {r"(q)\1_proj": 8}}, "invalid_rank_pattern", r"(q)\\1_proj"),
        ({"rank_pattern": {"(": 8}}, "invalid_rank_pattern", "'('"),
        ({"alpha_pattern": {"q_proj(?<=x)": 8}}, "invalid_alpha_pattern", "q_proj(?<=x)"),
        ({"alpha_pattern": {"q_proj": "big"}}, "invalid_alpha_pattern", "numbers"),
        (
            {"rank_pattern": {f"m{i}": 8 for i in range(MAX_PATTERN_KEYS + 1)}},
            "invalid_rank_pattern",
            str(MAX_PATTERN_KEYS),
        ),
    ],
)
def test_an_unsupported_pattern_is_a_400_naming_the_key(tmp_path, config, code, named):
    root = write_adapter_dir(tmp_path, AdapterSpec(extra_config=config))

    with pytest.raises(ArtifactRejected) as caught:
        inspect_adapter(root)

    assert (caught.value.code, caught.value.status) == (code, 400)
    assert named in caught.value.message
