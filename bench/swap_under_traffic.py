"""Swapping an adapter's version under continuous traffic, on a real vLLM.

    .venv/bin/python -m bench.swap_under_traffic [--rounds 5] [--clients 4]

Clients keep sending one-token completions with model=<served name> while the
name is swapped from v1 to v2 (a new, immutable path each time, as rollouts
stage them). For each strategy the script counts the requests that fail during
the swap window, and the throughput before, during and after the swap:

  unload+load   POST /v1/unload_lora_adapter, then /v1/load_lora_adapter with
                the new path (vLLM <= 0.32's only safe swap; leaves a moment
                when the name is unknown: 404 "model does not exist")
  load_inplace  POST /v1/load_lora_adapter {"load_inplace": true} with the new
                path (no gap; on 0.32 the flag sticks and the adapter is
                re-read from disk every engine step, vLLM #33791)
  baseline      no swap at all in the same window (the run's own noise floor)

The figures are printed as a table; docs/figures.md quotes them. Real vLLM (no
stand-in). --smoke: one round, 2 clients, 0.5 s settle; --replica-urls URL uses
a running server (started with --max-loras 2 --max-cpu-loras 4 --max-lora-rank 16).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench import results as bench_results
from tests.support.adapters import AdapterSpec, write_adapter_dir
from tests.support.vllm_servers import ensure_tiny_model, ensure_vllm_installed, start_servers

SERVED_BASE = "tiny-llama"
NAME = "swap-target"


@dataclass
class Traffic:
    """Completion results as (monotonic time, ok, status) from every client."""

    url: str
    clients: int
    timeout: float = 30.0  # seconds one completion may take
    results: list[tuple[float, bool, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        session = requests.Session()
        body = {"model": NAME, "prompt": "The contract says", "max_tokens": 1, "temperature": 0}
        while not self._stop.is_set():
            try:
                status = session.post(
                    self.url + "/v1/completions", json=body, timeout=self.timeout
                ).status_code
            except requests.RequestException:
                status = 0
            with self._lock:
                self.results.append((time.monotonic(), status == 200, status))

    def __enter__(self) -> Traffic:
        self._threads = [
            threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)

    def window(self, start: float, end: float) -> tuple[int, int, float]:
        """(requests, failures, requests per second) finished in [start, end)."""
        return self.count([(start, end)])

    def count(self, windows: list[tuple[float, float]]) -> tuple[int, int, float]:
        """(requests, failures, requests per second) finished inside the windows."""
        inside = [r for r in self.results if any(a <= r[0] < b for a, b in windows)]
        seconds = sum(b - a for a, b in windows)
        return len(inside), sum(1 for r in inside if not r[1]), len(inside) / max(seconds, 1e-9)


def _post(url: str, path: str, body: dict) -> requests.Response:
    return requests.post(url + path, json=body, timeout=120)


def swap(url: str, strategy: str, new_path: str) -> None:
    if strategy == "unload+load":
        _post(url, "/v1/unload_lora_adapter", {"lora_name": NAME})
        response = _post(url, "/v1/load_lora_adapter", {"lora_name": NAME, "lora_path": new_path})
    elif strategy == "load_inplace":
        response = _post(
            url,
            "/v1/load_lora_adapter",
            {"lora_name": NAME, "lora_path": new_path, "load_inplace": True},
        )
    else:
        return
    if response.status_code != 200:
        raise RuntimeError(f"{strategy}: {response.status_code} {response.text[:200]}")


def one_round(url: str, strategy: str, paths: list[str], clients: int, settle: float) -> dict:
    # A fresh name per round: load_inplace on 0.32 keeps re-reading once set.
    _post(url, "/v1/unload_lora_adapter", {"lora_name": NAME})
    loaded = _post(url, "/v1/load_lora_adapter", {"lora_name": NAME, "lora_path": paths[0]})
    assert loaded.status_code == 200, loaded.text
    with Traffic(url, clients) as traffic:
        time.sleep(settle)
        swap_start = time.monotonic()
        swap(url, strategy, paths[1])
        swap_end = time.monotonic()
        # At least a short window, so "during" counts the requests in flight.
        swap_end = max(swap_end, swap_start + 0.25)
        time.sleep(settle)
        end = time.monotonic()
    before = traffic.window(swap_start - settle, swap_start)
    during = traffic.window(swap_start, swap_end)
    after = traffic.window(swap_end, end)
    return {
        "failed_during": during[1],
        "failed_total": before[1] + during[1] + after[1],
        "rps_before": before[2],
        "rps_during": during[2],
        "rps_after": after[2],
        "swap_ms": (swap_end - swap_start) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before and after")
    parser.add_argument(
        "--replica-urls", default="", help="one running vLLM server (default: start one)"
    )
    bench_results.add_arguments(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.clients, args.settle = 1, 2, 0.5

    work = Path(tempfile.mkdtemp(prefix="swap-bench-"))
    server = None
    if args.replica_urls:
        url = args.replica_urls.split(",")[0].strip()
    else:
        ensure_vllm_installed()
        (server,) = start_servers(
            1,
            model_dir=ensure_tiny_model(),
            served_name=SERVED_BASE,
            max_loras=2,
            max_cpu_loras=4,
            max_lora_rank=16,
            log_dir=work / "logs",
            timeout=300,
        )
        url = server.base_url
    try:
        strategies = ["baseline", "unload+load", "load_inplace"]
        results: dict[str, list[dict]] = {s: [] for s in strategies}
        for round_number in range(args.rounds):
            for offset, strategy in enumerate(strategies):
                # Rotate the order so no strategy always runs on a warmer server.
                strategy = strategies[(offset + round_number) % len(strategies)]
                paths = [
                    str(
                        write_adapter_dir(
                            work / f"{strategy}-{round_number}-v{n}",
                            AdapterSpec(seed=n + 10 * round_number),
                        )
                    )
                    for n in (1, 2)
                ]
                results[strategy].append(one_round(url, strategy, paths, args.clients, args.settle))
        heading = (
            f"Swap under traffic: real vLLM {url}, {args.clients} clients, "
            f"{args.rounds} rounds (medians; worst round in brackets)"
        )
        print("\n" + heading)
        out = bench_results.Results("swap_under_traffic", args)
        out.note(heading)
        columns = ["failed in swap", "failed total", "rps before", "rps during", "rps after"]
        table = out.table("strategies", ["strategy", *columns, "swap ms"], "swap under traffic")
        print(f"{'strategy':<14}" + "".join(f"{c:>16}" for c in columns) + f"{'swap ms':>10}")
        for strategy, rows in results.items():
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            worst = max(r["failed_during"] for r in rows)
            cells = [
                f"{med['failed_during']:.0f} ({worst})",
                f"{med['failed_total']:.0f}",
                f"{med['rps_before']:.1f}",
                f"{med['rps_during']:.1f}",
                f"{med['rps_after']:.1f}",
            ]
            print(
                f"{strategy:<14}" + "".join(f"{c:>16}" for c in cells) + f"{med['swap_ms']:>10.0f}"
            )
            table.row(strategy, *cells, round(med["swap_ms"]))
            if strategy == "unload+load":  # the default on vLLM 0.32
                out.headline(
                    "version swap under traffic, vLLM 0.32 (unload + load)",
                    f"{med['failed_during']:.0f} failed requests ({worst} worst)",
                    "no swap: "
                    + f"{statistics.median(r['failed_during'] for r in results['baseline']):.0f}",
                    f"0: {'met' if worst == 0 else 'not met'}",
                )
        out.write()
    finally:
        if server is not None:
            server.stop()
        else:  # a shared server: leave it without the load_inplace adapter (it sticks)
            _post(url, "/v1/unload_lora_adapter", {"lora_name": NAME})


if __name__ == "__main__":
    main()
