"""Idempotency-Key claims: the first request with a key inserts the claim row
before it reads its artifact; every other request with that key answers with
the first one's version once it commits, if (and only if) it is the same request.

Why a row and not a check: checking "is there a version with this key?" and
then ingesting is a race. Two requests both see "no", both ingest, and the
second then trips over the first's identical artifact (409 duplicate_artifact)
instead of getting its result. Inserting the claim is atomic, so exactly one
request ingests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.errors import Conflict, ValidationFailed
from registry.models import Adapter, AdapterVersion, IdempotencyClaim

POLL_SECONDS = 0.05


class KeyReused(Conflict):
    code = "idempotency_key_reused"


class KeyInProgress(Conflict):
    code = "idempotency_key_in_progress"


@dataclass
class ClaimOutcome:
    claim: IdempotencyClaim
    won: bool


def require_valid_key(key: str) -> None:
    if not 1 <= len(key) <= 200:
        raise ValidationFailed(
            "Idempotency-Key must be 1 to 200 characters.", code="bad_idempotency_key"
        )


def idempotency_claim(*, adapter: Adapter, key: str) -> ClaimOutcome:
    """Takes the key, or returns whoever holds it. Commits on its own, so that
    other requests see the claim at once."""
    require_valid_key(key)
    for _attempt in range(3):
        try:
            with transaction.atomic():
                claim = IdempotencyClaim.objects.create(adapter=adapter, key=key)
            return ClaimOutcome(claim, won=True)
        except IntegrityError:
            pass
        held = IdempotencyClaim.objects.filter(adapter=adapter, key=key).first()
        if held is None:
            continue  # released between our insert and our read: try again
        stale = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_CLAIM_STALE_SECONDS)
        if held.version_id is None and held.created_at < stale:
            # Its request died without releasing it; only one taker deletes it.
            IdempotencyClaim.objects.filter(
                pk=held.pk, version__isnull=True, created_at__lt=stale
            ).delete()
            continue
        return ClaimOutcome(held, won=False)
    raise KeyInProgress(
        "Another request is taking this Idempotency-Key right now; send it again.",
    )


def idempotency_bind(*, claim: IdempotencyClaim, digest: str) -> None:
    claim.request_digest = digest
    IdempotencyClaim.objects.filter(pk=claim.pk).update(request_digest=digest)


def idempotency_complete(*, claim: IdempotencyClaim, version: AdapterVersion) -> None:
    """Call in the transaction that creates the version (or finds the one a
    retry resolves to), so that waiters see the claim done only once it commits."""
    IdempotencyClaim.objects.filter(pk=claim.pk).update(version=version)


def idempotency_release(*, claim: IdempotencyClaim) -> None:
    """The holder failed: free the key so that a retry can ingest."""
    IdempotencyClaim.objects.filter(pk=claim.pk, version__isnull=True).delete()


def idempotency_result(*, claim: IdempotencyClaim, digest: str) -> AdapterVersion:
    """The holder's version once it commits, for a request with the same digest.
    Bounded by IDEMPOTENCY_WAIT_SECONDS."""
    deadline = time.monotonic() + settings.IDEMPOTENCY_WAIT_SECONDS
    while True:
        current = IdempotencyClaim.objects.filter(pk=claim.pk).select_related("version").first()
        if current is None:
            raise KeyInProgress(
                "The request that held this Idempotency-Key failed just now; send it again.",
            )
        # A digest mismatch is known as soon as the holder has read its body.
        if current.request_digest and current.request_digest != digest:
            raise KeyReused(
                "This Idempotency-Key was used for a different request (another body, "
                "method or path). Use a new key for a new request.",
                details={"key": claim.key},
            )
        if current.version is not None:
            return current.version
        if time.monotonic() >= deadline:
            raise KeyInProgress(
                f"A request with this Idempotency-Key is still running after "
                f"{settings.IDEMPOTENCY_WAIT_SECONDS:g} s; send it again later.",
            )
        time.sleep(POLL_SECONDS)
