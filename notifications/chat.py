"""What a chat channel receives: the event's title and the link to its page,
as {"text": ...}, the body both Slack's and Microsoft Teams' incoming webhooks
take. Rendered from templates/notifications/chat/message.txt."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from django.conf import settings
from django.template.loader import render_to_string

# Slack cuts a message's text at 40,000 characters and Teams refuses bodies over
# 28 KB; an event's title is at most 300, so this bound is never the reader's.
MAX_TEXT = 3000


def chat_body(event) -> bytes:
    site = settings.NOTIFICATIONS_SITE_URL.rstrip("/")
    text = render_to_string(
        "notifications/chat/message.txt",
        {"title": event.title, "link": f"{site}{event.link}" if event.link else ""},
    ).strip()
    return json.dumps({"text": text[:MAX_TEXT]}).encode()


def shown_url(url: str) -> str:
    """What is shown of a chat URL: its scheme and host; the path is the credential."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…"
