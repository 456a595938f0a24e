"""Model fields for secrets the product must keep (for example a vLLM API key):
encrypted at rest with Fernet, so a database dump or backup does not hand them out.

The key is FIELD_ENCRYPTION_KEY (or its _FILE), else derived from
DJANGO_SECRET_KEY; rotating it makes stored secrets unreadable, and reading
one then fails loudly instead of sending a wrong key.
"""

from __future__ import annotations

import base64
import hashlib
from functools import cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import models

PREFIX = "fernet:"


@cache
def _fernet(key_material: str) -> Fernet:
    digest = hashlib.sha256(b"registry-field-encryption:" + key_material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _cipher() -> Fernet:
    return _fernet(settings.FIELD_ENCRYPTION_KEY or settings.SECRET_KEY)


def encrypt(value: str) -> str:
    return PREFIX + _cipher().encrypt(value.encode()).decode()


def decrypt(stored: str) -> str:
    if not stored.startswith(PREFIX):
        # Written before encryption existed; encrypted again on the next save.
        return stored
    try:
        return _cipher().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise ValueError(
            "A stored secret cannot be decrypted: FIELD_ENCRYPTION_KEY (or DJANGO_SECRET_KEY) "
            "changed since it was saved. Set the old key, or enter the secret again."
        ) from None


class EncryptedTextField(models.TextField):
    description = "Text encrypted at rest"

    def from_db_value(self, value, expression, connection):
        return decrypt(value) if value else value

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return encrypt(value) if value else value
