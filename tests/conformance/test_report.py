"""The tier's reports: the README's per-architecture summary block is rewritten
from the results, and nothing else of the README changes."""

from __future__ import annotations

from tests.conformance import report


def _row(architecture: str, option: str, agrees: bool, product: str, error=None) -> dict:
    return {
        "architecture": architecture,
        "option": option,
        "expected": "serve",
        "vllm": "served, PEFT's tokens",
        "agrees": agrees,
        "product": product,
        "error": error,
    }


def test_the_readme_block_counts_each_architectures_verdicts(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    before, after = "# Title\n\ntext before\n", "\ntext after\n"
    readme.write_text(f"{before}{report.SUMMARY_START}\nold\n{report.SUMMARY_END}{after}")
    monkeypatch.setattr(report, "README", readme)
    monkeypatch.setattr(report, "DOC", tmp_path / "conformance.md")
    results = {
        "qwen2": [
            _row("qwen2", "rank 8", True, "served, PEFT's tokens", error=2e-6),
            _row("qwen2", "bias lora_only", True, "refused at upload (invalid_config)"),
            _row("qwen2", "dora", False, "served, WRONG tokens"),
        ],
        "llama": [_row("llama", "rank 8", True, "served, PEFT's tokens", error=5e-7)],
    }

    report.write(results)

    text = readme.read_text()
    assert text.startswith(before) and text.endswith(after) and "old" not in text
    assert "| verdict | llama | qwen2 |" in text  # the matrix's architecture order
    assert "| cases where the product agrees | 1 of 1 | 2 of 3 |" in text
    assert "| served, PEFT's tokens | 1 | 1 |" in text
    assert "| refused, as vLLM or policy | 0 | 1 |" in text
    assert "largest logprob gap 2.0e-06 nats" in text
    assert report.START in (tmp_path / "conformance.md").read_text()
