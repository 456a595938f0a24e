"""An email backend that keeps messages in the database instead of sending
them: `make run`'s default, so that the outbox page shows a newcomer what would
have been mailed (production sets EMAIL_BACKEND to SMTP)."""

from __future__ import annotations

from django.core.mail.backends.base import BaseEmailBackend


class OutboxBackend(BaseEmailBackend):
    def send_messages(self, email_messages) -> int:
        from notifications.models import OutboxMail

        sent = 0
        for message in email_messages:
            html = next(
                (
                    body
                    for body, kind in getattr(message, "alternatives", [])
                    if kind == "text/html"
                ),
                "",
            )
            OutboxMail.objects.create(
                to=", ".join(message.recipients())[:1000],
                subject=message.subject[:300],
                body=message.body,
                html=html,
            )
            sent += 1
        return sent
