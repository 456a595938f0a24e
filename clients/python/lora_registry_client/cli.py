"""`lora-registry`: the registry's API for pipelines, with exit codes to branch on
(see the package README)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from lora_registry_client.client import (
    MAX_PAGE_SIZE,
    ApiError,
    Client,
    Unreachable,
    WaitTimeout,
)
from lora_registry_client.webhooks import verify_signature

OK, USAGE, REFUSED, DENIED, FAILED, TIMED_OUT, UNREACHABLE = 0, 2, 3, 4, 5, 6, 7
MLFLOW_RUN = re.compile(r"^runs:/(?P<run>[A-Za-z0-9_-]{1,64})(?:/(?P<path>.+))?$")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "offline", False):
        return args.run(None, args)
    if not args.url:
        print("lora-registry: give --url or set LORA_REGISTRY_URL", file=sys.stderr)
        return USAGE
    client = Client(args.url, args.token, timeout=args.http_timeout)
    try:
        return args.run(client, args)
    except ApiError as error:
        _say(f"{error.code}: {error.message}")
        if args.json:
            _print_json(
                {
                    "error": {
                        "status": error.status,
                        "code": error.code,
                        "message": error.message,
                        "details": error.details,
                    }
                }
            )
        return (
            DENIED
            if error.status in (401, 403, 404)
            else (UNREACHABLE if error.status >= 500 else REFUSED)
        )
    except WaitTimeout as error:
        _say(f"timed out: {error}")
        if args.json and error.last is not None:
            _print_json(error.last)
        return TIMED_OUT
    except Unreachable as error:
        _say(f"the registry could not be reached: {error}")
        return UNREACHABLE
    except ValueError as error:
        _say(str(error))
        return USAGE


# -- commands ---------------------------------------------------------------------


def _register(client: Client, args) -> int:
    department, _, name = args.adapter.partition("/")
    if not department or not name:
        raise ValueError("the adapter is DEPARTMENT/NAME, e.g. legal/contracts")
    adapter = client.find_adapter(department, name)
    key = None if args.no_idempotency_key else (args.idempotency_key or "auto")
    lineage = {
        k: v for k, v in (("source_commit", args.source_commit), ("dataset", args.dataset)) if v
    }
    source = args.source
    if source.startswith("s3://"):
        version = client.register(
            adapter["id"], s3_uri=source, idempotency_key=key, lineage=lineage
        )
    elif match := MLFLOW_RUN.match(source):
        version = client.register(
            adapter["id"],
            mlflow_run_id=match["run"],
            artifact_path=match["path"] or args.artifact_path,
        )
    else:
        version = client.register(adapter["id"], path=source, idempotency_key=key, lineage=lineage)
    for warning in version.get("warnings") or []:
        _say(f"warning: {warning}")
    _done(
        args,
        version,
        f"registered {args.adapter} v{version['number']} (version {version['id']}, "
        f"{version['status']})",
    )
    return OK


def _submit(client: Client, args) -> int:
    version = client.submit(args.version, args.comment)
    _done(args, version, f"version {version['id']} (v{version['number']}) is {version['status']}")
    return OK


def _promote(client: Client, args) -> int:
    promotion = client.promote(args.deployment, args.version, canary=args.canary)
    _say(
        f"promotion {promotion['id']}: {promotion['status']}"
        + (f", rollout {promotion['rollout']}" if promotion.get("rollout") else "")
    )
    if not args.wait:
        _done(args, promotion, None)
        return FAILED if promotion["status"] in ("rejected", "cancelled") else OK
    ended = client.wait_served(
        promotion["id"], timeout=args.timeout, interval=args.interval, on_progress=_progress
    )
    return _ended(args, ended)


def _watch(client: Client, args) -> int:
    ended = client.wait_rollout(
        args.rollout, timeout=args.timeout, interval=args.interval, on_progress=_progress
    )
    return _ended(args, ended)


def _ended(args, ended: dict[str, Any]) -> int:
    """A finished rollout, or a promotion that was refused."""
    if "kind" not in ended:  # a promotion
        _done(
            args,
            ended,
            f"promotion {ended['id']} was {ended['status']}: {ended.get('comment', '')}",
        )
        return FAILED
    summary = (ended.get("replicas_summary") or {}).get("text", "")
    if ended["status"] == "succeeded":
        _done(args, ended, f"served: rollout {ended['id']} succeeded ({summary})")
        return OK
    _done(args, ended, f"rollout {ended['id']} {ended['status']}: {ended.get('error') or summary}")
    return FAILED


def _progress(thing: dict[str, Any]) -> None:
    if "kind" in thing:
        summary = (thing.get("replicas_summary") or {}).get("text", "")
        _say(f"rollout {thing['id']}: {thing['status']}" + (f" ({summary})" if summary else ""))
    else:
        _say(f"promotion {thing['id']}: {thing['status']}")


# -- output ----------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _done(args, value: dict[str, Any], line: str | None) -> None:
    if args.json:
        _print_json(value)
    elif line:
        print(line)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("LORA_REGISTRY_URL"),
        help="the registry, e.g. http://127.0.0.1:8000 (LORA_REGISTRY_URL)",
    )
    common.add_argument(
        "--token",
        default=os.environ.get("LORA_REGISTRY_TOKEN"),
        help="an API token, lrt_... (LORA_REGISTRY_TOKEN)",
    )
    common.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    common.add_argument("--http-timeout", type=float, default=120.0, help=argparse.SUPPRESS)

    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--timeout", type=float, default=600.0, help="seconds to wait at most")
    waiting.add_argument("--interval", type=float, default=1.0, help="seconds between polls")

    parser = argparse.ArgumentParser(
        # The options go after the command (`lora-registry promote --json ...`): on both
        # levels, a sub-command's defaults would overwrite what was given before it.
        prog="lora-registry",
        description=__doc__.split("\n")[0],
    )
    commands = parser.add_subparsers(dest="command", required=True)

    register = commands.add_parser(
        "register", parents=[common], help="register a version from a folder, archive, S3 or MLflow"
    )
    register.add_argument("adapter", help="DEPARTMENT/NAME")
    register.add_argument(
        "source", help="a PEFT folder, an archive, s3://..., or runs:/RUN_ID/PATH"
    )
    register.add_argument(
        "--artifact-path",
        default="adapter",
        help="the run's folder when the runs:/ URI names none (default: adapter)",
    )
    register.add_argument("--source-commit", default="")
    register.add_argument("--dataset", default="")
    keys = register.add_mutually_exclusive_group()
    keys.add_argument("--idempotency-key", help="default: derived from the adapter and content")
    keys.add_argument("--no-idempotency-key", action="store_true")
    register.set_defaults(run=_register)

    submit = commands.add_parser("submit", parents=[common], help="submit a version for review")
    submit.add_argument("version", type=int)
    submit.add_argument("--comment", default="")
    submit.set_defaults(run=_submit)

    promote = commands.add_parser(
        "promote", parents=[common, waiting], help="promote an approved version to a deployment"
    )
    promote.add_argument("deployment")
    promote.add_argument("version", type=int)
    promote.add_argument("--canary", action=argparse.BooleanOptionalAction, default=None)
    promote.add_argument("--wait", action="store_true", help="wait until it is served")
    promote.set_defaults(run=_promote)

    rollouts = commands.add_parser("rollouts", help="rollouts").add_subparsers(
        dest="rollouts_command", required=True
    )
    watch = rollouts.add_parser(
        "watch", parents=[common, waiting], help="follow a rollout to its end"
    )
    watch.add_argument("rollout", type=int)
    watch.set_defaults(run=_watch)

    events = commands.add_parser(
        "events",
        parents=[common],
        help="a department's events (its audit log); --follow tails them until Ctrl-C",
    )
    events.add_argument("department", help="the department's slug")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new ones")
    events.add_argument("--last", type=int, default=10, help="how many past ones first (10)")
    events.add_argument(
        "--page-size", type=int, default=100, help="events per request, 1 to 500 (100)"
    )
    events.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    events.set_defaults(run=_events)

    webhook = commands.add_parser("webhook", help="webhooks the registry sends").add_subparsers(
        dest="webhook_command", required=True
    )
    verify = webhook.add_parser(
        "verify",
        help="check a delivery's signature (exit 0: valid, 3: not)",
        description="Reads the body from a file or stdin and checks the "
        "X-LoRA-Registry-Signature header against the webhook's secret; no registry is called.",
    )
    verify.add_argument("--signature", required=True, help="the X-LoRA-Registry-Signature value")
    verify.add_argument(
        "--secret",
        default=os.environ.get("LORA_REGISTRY_WEBHOOK_SECRET"),
        help="the webhook's secret, whsec_... (LORA_REGISTRY_WEBHOOK_SECRET)",
    )
    verify.add_argument("--body", default="-", help="a file with the raw body (default: stdin)")
    verify.add_argument(
        "--tolerance", type=int, default=300, help="seconds a timestamp may be off (default 300)"
    )
    verify.set_defaults(run=_webhook_verify, offline=True)
    return parser


def _events(client: Client, args) -> int:
    if not 0 <= args.last <= MAX_PAGE_SIZE:
        raise ValueError(f"--last must be 0 to {MAX_PAGE_SIZE}, got {args.last}")
    if not 1 <= args.page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"--page-size must be 1 to {MAX_PAGE_SIZE}, got {args.page_size}")
    if not args.follow:
        shown = client.events(args.department, last=args.last) if args.last else []
    else:
        shown = client.follow_events(
            args.department, last=args.last, page_size=args.page_size, interval=args.interval
        )
    try:
        for event in shown:
            if args.json:
                # One object a line, so a pipe reads each as it comes.
                print(json.dumps(event, sort_keys=True), flush=True)
            else:
                print(_event_line(event), flush=True)
    except KeyboardInterrupt:
        return OK  # Ctrl-C is how --follow ends
    return OK


def _event_line(event: dict[str, Any]) -> str:
    states = (
        f" {event['from_state'] or '-'} -> {event['to_state']}" if event.get("to_state") else ""
    )
    return (
        f"{event['created_at']}  {event['action']}  {event.get('object_repr') or ''}"
        f"{states}  by {event.get('actor') or 'system'}"
    )


def _webhook_verify(client, args) -> int:
    if not args.secret:
        _say("lora-registry: give --secret or set LORA_REGISTRY_WEBHOOK_SECRET")
        return USAGE
    if args.body == "-":
        body = sys.stdin.buffer.read()
    else:
        with open(args.body, "rb") as file:
            body = file.read()
    if verify_signature(args.secret, body, args.signature, tolerance=args.tolerance):
        print("valid")
        return OK
    _say("invalid: the signature does not match the body, or its timestamp is too old")
    return REFUSED


if __name__ == "__main__":
    sys.exit(main())
