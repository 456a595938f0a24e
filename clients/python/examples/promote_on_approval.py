"""A pipeline's webhook receiver: promote a version as soon as a person approved it.

The step a pipeline cannot wait on is the four-eyes one: a person approves when
they have looked. This receiver takes the registry's signed `version.approved`
events (docs/pipelines/webhooks.md) and promotes the version to one deployment
with the pipeline's token. Run it next to the pipeline:

    LORA_REGISTRY_URL=https://registry.example.com LORA_REGISTRY_TOKEN=lrt_... \\
    WEBHOOK_SECRET=whsec_... python promote_on_approval.py \\
        --deployment prod-a100 --listen 0.0.0.0:8300

It checks each signature (and its age) before reading the event, answers at
once and promotes after (the registry waits at most 10 s for an answer), and
keeps the ids it has handled: a delivery can come twice, always with the same
id. The token needs the `deployments:promote` ability for the department.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lora_registry_client.client import ApiError, Client, Unreachable
from lora_registry_client.webhooks import verify_signature

MAX_BODY = 1024 * 1024  # an event is a few KiB; refuse anything far larger


class Promoter:
    """What the receiver does with a verified event, once per event id."""

    def __init__(self, client: Client, deployment: str):
        self.client = client
        self.deployment = deployment
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def first_time(self, event_id: str) -> bool:
        with self.lock:
            if event_id in self.seen:
                return False
            self.seen.add(event_id)
            return True

    def handle(self, event: dict) -> None:
        if event.get("type") != "version.approved":
            return
        version = event["data"]["version"]
        served_name = event["data"]["adapter"]["served_name"]
        what = f"version {version['number']} of {served_name}"
        try:
            promotion = self.client.promote(self.deployment, version["id"])
        except (ApiError, Unreachable) as error:
            say(f"{event['type']} {event['id']}: could not promote {what}: {error}")
            return
        say(
            f"{event['type']} {event['id']}: promoted {what} to {self.deployment}: "
            f"promotion {promotion['id']} {promotion['status']}, rollout {promotion.get('rollout')}"
        )


def say(line: str) -> None:
    print(line, flush=True)


def handler_for(promoter: Promoter, secret: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                return self.answer(411, "a Content-Length is needed")
            if not 0 < length <= MAX_BODY:
                return self.answer(413, "no event is that large")
            body = self.rfile.read(length)
            signature = self.headers.get("X-LoRA-Registry-Signature", "")
            if not verify_signature(secret, body, signature):
                return self.answer(400, "bad or old signature")
            event = json.loads(body)
            self.answer(200, "thanks")
            if promoter.first_time(event["id"]):
                promoter.handle(event)

        def answer(self, status: int, text: str) -> None:
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def log_message(self, *args):
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployment", required=True, help="where approved versions go")
    parser.add_argument("--listen", default="127.0.0.1:8300", help="HOST:PORT (127.0.0.1:8300)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error("--listen is HOST:PORT, e.g. 127.0.0.1:8300")
    missing = [
        name
        for name in ("LORA_REGISTRY_URL", "LORA_REGISTRY_TOKEN", "WEBHOOK_SECRET")
        if not os.environ.get(name)
    ]
    if missing:
        parser.error(f"set {', '.join(missing)} in the environment")
    client = Client(os.environ["LORA_REGISTRY_URL"], os.environ["LORA_REGISTRY_TOKEN"])
    promoter = Promoter(client, args.deployment)
    server = ThreadingHTTPServer(
        (host, int(port)), handler_for(promoter, os.environ["WEBHOOK_SECRET"])
    )
    say(f"listening on http://{host}:{port}/ for version.approved")
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
