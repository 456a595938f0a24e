"""A real Prometheus (Debian's `prometheus` package) for tests: started on a
free loopback port with a generated config, scraping every second, queried
through its HTTP API with PromQL."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import yaml

from tests.support.process_start import wait_until_started
from tests.support.vllm_servers import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def prometheus_available() -> bool:
    return Path(PROMETHEUS).is_file()


@dataclass
class ScrapeJob:
    name: str
    targets: list[str]  # base URLs: http://host:port
    bearer_token: str | None = None
    metrics_path: str = "/metrics"

    def config(self) -> dict[str, Any]:
        job: dict[str, Any] = {
            "job_name": self.name,
            "metrics_path": self.metrics_path,
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": [urlsplit(t).netloc for t in self.targets]}],
        }
        if self.bearer_token:
            job["authorization"] = {"type": "Bearer", "credentials": self.bearer_token}
        return job


class PrometheusServer:
    def __init__(self, jobs: list[ScrapeJob], workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.jobs = jobs
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [job.config() for job in self.jobs],
        }
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(  # noqa: S603 - fixed binary, generated config
            [
                PROMETHEUS,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until_started(
            self.process, self._ready, what="prometheus", log=self.log_path, poll_seconds=0.2
        )
        return self

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def query(self, promql: str) -> list[dict]:
        """An instant query: [{"metric": {labels}, "value": float}]."""
        response = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = response.json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": float(result[1])}]
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in result]

    def value(self, promql: str) -> float | None:
        """The single value of a query, None when it has no result."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return result[0]["value"] if result else None

    def wait_for(
        self, promql: str, expected: Callable[[float | None], bool], timeout: float = 60
    ) -> float | None:
        """Polls until the query's value satisfies `expected` (scrapes are 1 s apart)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.value(promql)
            if expected(last):
                return last
            time.sleep(0.5)
        targets = requests.get(f"{self.url}/api/v1/targets", timeout=10).json()
        health = [
            (t["labels"].get("job"), t["health"], t.get("lastError"))
            for t in targets["data"]["activeTargets"]
        ]
        raise AssertionError(f"{promql} is {last} after {timeout}s; targets {health}")

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
