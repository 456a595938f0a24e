"""docs/walkthrough.md, run as written against `make run`'s processes.

The page is the test's only script. Its header comment names the defaults the
test moves (ports, the var directory, the repository's placeholder path); the
test picks free ports and a fresh directory, rewrites those defaults wherever
the page names them, and then:

- starts the block marked `<!-- walkthrough: start, ready when it prints "…" -->`
  (`make run`) in the background, with the moved values in its environment,
  and waits for that text;
- runs every other ```sh block, in order, in one bash shell (so the page's
  variables and functions carry over), except those marked
  `<!-- walkthrough: skip ... -->`;
- compares what each block printed with the ```text or ```json block right
  after it ("…" stands for any text; JSON is compared as values, so layout does
  not matter). A block with no output block after it must print nothing.

When the page changes (a front door, a CLI), only the page changes: a new
default to move goes into its header, a new command into its blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.vllm_servers import free_port

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "walkthrough.md"
ANY = "…"
# The first `make run` installs vLLM (minutes); later ones start in about a minute.
START_TIMEOUT = 1800
BLOCK_TIMEOUT = 600


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    end: int  # of the closing fence, 0-based
    info: str
    text: str
    directive: str  # the `<!-- walkthrough: ... -->` right before it, or ""


@dataclass
class Step:
    block: Block
    expected: list[Block]


def parse_blocks(page: str) -> list[Block]:
    blocks, lines, i = [], page.splitlines(), 0
    last_comment, last_comment_line = "", -2
    while i < len(lines):
        line = lines[i]
        comment = re.match(r"\s*<!--\s*walkthrough:\s*(.*?)\s*-->\s*$", line)
        if comment:
            last_comment, last_comment_line = comment.group(1), i
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            start = i
            i += 1
            body = []
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            directive = last_comment if last_comment_line == start - 1 else ""
            blocks.append(Block(start + 1, i, fence.group(1), "\n".join(body), directive))
        i += 1
    return blocks


def steps_of(page: str) -> list[Step]:
    """Each ```sh block with the output blocks that directly follow it (only
    blank lines between)."""
    lines = page.splitlines()
    steps: list[Step] = []
    blocks = parse_blocks(page)
    for index, block in enumerate(blocks):
        if block.info != "sh":
            continue
        expected, end = [], block.end
        for later in blocks[index + 1 :]:
            between = lines[end + 1 : later.line - 1]
            if later.info not in ("text", "json") or any(x.strip() for x in between):
                break
            expected.append(later)
            end = later.end
        steps.append(Step(block, expected))
    return steps


def header(page: str) -> dict[str, str]:
    match = re.search(r"<!-- walkthrough-test:(.*?)-->", page, re.S)
    assert match, "docs/walkthrough.md lost its walkthrough-test header"
    fields = {}
    for line in match.group(1).splitlines():
        key, sep, value = line.strip().partition(": ")
        if sep and key in ("repo", "ports", "dirs"):
            fields[key] = value.strip()
    return fields


def assignments(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split())


def glob(pattern: str, text: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split(ANY))
    return re.fullmatch(regex, text, re.S) is not None


def json_values(text: str) -> list:
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return values
        value, at = decoder.raw_decode(text, at)
        values.append(value)


def json_matches(expected, actual) -> bool:
    if expected == ANY:
        return True
    if isinstance(expected, str) and ANY in expected:
        return isinstance(actual, str) and glob(expected, actual)
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(json_matches(v, actual[k]) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(json_matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and expected == actual


def output_matches(expected: list[Block], output: str) -> bool:
    if not expected:
        return output.strip() == ""
    if all(b.info == "json" for b in expected):
        try:
            actual = json_values(output)
        except json.JSONDecodeError:
            return False
        wanted = [v for b in expected for v in json_values(b.text)]
        return json_matches(wanted, actual)
    wanted_lines = [line for b in expected for line in b.text.strip("\n").splitlines()]
    actual_lines = output.strip("\n").splitlines()
    return len(wanted_lines) == len(actual_lines) and all(
        glob(w.rstrip(), a.rstrip()) for w, a in zip(wanted_lines, actual_lines, strict=True)
    )


class Shell:
    """One bash for the whole page: each block is written to its stdin, then a
    marker line with the block's exit status."""

    def __init__(self, cwd: Path, env: dict[str, str]):
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line)

    def run(self, text: str, timeout: float) -> tuple[int, str]:
        marker = f"__walkthrough_done_{time.monotonic_ns()}__"
        self.process.stdin.write(f"{text}\nprintf '\\n{marker} %d\\n' $?\n")
        self.process.stdin.flush()
        output, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"still running after {timeout:.0f} s; printed so far:\n{''.join(output)}"
                ) from None
            if line.startswith(marker):
                status = int(line.split()[1])
                text_out = "".join(output)
                return status, text_out[:-1] if text_out.endswith("\n") else text_out
            output.append(line)

    def close(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def moved(page: str, tmp_path: Path, clone: Path = REPO) -> tuple[str, dict[str, str]]:
    """The page with its defaults moved, and the environment that moves them;
    the repository's placeholder path becomes `clone`."""
    fields = header(page)
    env = {}
    for name, default in assignments(fields.get("ports", "")).items():
        port = str(free_port())
        env[name] = port
        page = re.sub(rf"(127\.0\.0\.1|localhost):{default}\b", rf"\g<1>:{port}", page)
    for name, default in assignments(fields.get("dirs", "")).items():
        directory = tmp_path / default
        env[name] = str(directory)
        # A relative path as the page writes it (`var/...`), not the tail of one (`/…/var/`).
        page = re.sub(rf"(?<![\w./…-]){re.escape(default)}/", f"{directory}/", page)
    if "repo" in fields:
        page = page.replace(fields["repo"], str(clone))
    return page, env


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """A newcomer's environment: none of the test run's DJANGO_*, DATABASE_URL,
    VAR_DIR, broker or MLflow settings, which `make run` would otherwise pick up."""
    keep = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["LANG"] = env["LC_ALL"] = "C.UTF-8"
    env.update(extra)
    return env


def start(block: Block, env: dict[str, str], log: Path, cwd: Path = REPO) -> subprocess.Popen:
    ready = re.search(r'ready when it prints "(.*?)"', block.directive)
    assert ready, f"line {block.line}: a start block says what it prints when ready"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", block.text],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while ready.group(1) not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail(f"`{block.text.strip()}` did not get ready:\n{tail(log)}")
        time.sleep(1)
    return process


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the group (run.sh passes it to its supervisor, which stops the
    web server, the workers, beat and vLLM), then SIGKILL whatever is left."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def test_the_page_is_a_script_the_test_can_run():
    # Cheap and first: the conventions hold, so a broken page fails in a second,
    # not after `make run` has started.
    page = PAGE.read_text()
    steps = steps_of(page)
    starts = [s for s in steps if s.block.directive.startswith("start")]
    assert len(starts) == 1, "exactly one block starts the product"
    assert all(not s.expected for s in starts)
    for step in steps:
        for block in step.expected:
            if block.info == "json":
                assert json_values(block.text), f"line {block.line}: empty JSON block"
    run = [s for s in steps if not s.block.directive]
    assert len(run) >= 10
    assert sum(1 for s in run if s.expected) >= len(run) - 2, "most blocks say what they print"
    assert output_matches([Block(0, 0, "text", "a …ms\nb", "")], "a 12ms\nb")
    assert not output_matches([Block(0, 0, "text", "a …ms\nb", "")], "a 12ms")
    wanted = [Block(0, 0, "json", '{"x": "v1-…", "n": 1}', "")]
    assert output_matches(wanted, '{\n"n": 1, "x": "v1-ab"}')
    assert not output_matches([Block(0, 0, "json", '{"n": 1}', "")], '{"n": true}')
    assert not output_matches([], "something")


@pytest.mark.skipif(
    not (shutil.which("jq") and shutil.which("curl")),
    reason="the walkthrough needs curl and jq (scripts/test.sh installs them)",
)
def test_the_walkthrough_runs_as_written(tmp_path):
    # From a clone reached through a symlink (macOS's /tmp, a linked home):
    # the shell's logical path then differs from the resolved one that Python
    # records, and vLLM reports what it was given (issue: every promotion
    # refused with replica_facts_disputed).
    clone = tmp_path / "linked-clone"
    clone.symlink_to(REPO, target_is_directory=True)
    page, moved_env = moved(PAGE.read_text(), tmp_path, clone)
    # bash keeps a logical $PWD only where the inherited PWD names its directory.
    env = clean_env({**moved_env, "PWD": str(clone)})
    log = tmp_path / "make-run.log"
    product = None
    shell = Shell(tmp_path, env)
    try:
        for step in steps_of(page):
            block = step.block
            if block.directive.startswith("skip"):
                continue
            if block.directive.startswith("start"):
                product = start(block, env, log, cwd=clone)
                continue
            status, output = shell.run(block.text, BLOCK_TIMEOUT)
            expected = "\n".join(b.text for b in step.expected) or "(nothing)"
            assert status == 0 and output_matches(step.expected, output), (
                f"docs/walkthrough.md line {block.line} (exit {status}):\n{block.text}\n"
                f"--- expected:\n{expected}\n--- printed:\n{output}\n"
                f"--- make run's log:\n{tail(log)}"
            )
        assert product is not None and product.poll() is None, "make run stopped early"
    finally:
        shell.close()
        if product is not None:
            stop(product)
