"""Forms every app's pages share: plain labels, and the sign-in form (the
sso app's login view and Django's auth views use it)."""

from __future__ import annotations

from django.contrib.auth.forms import AuthenticationForm


class PlainLabels:
    """Labels without Django's trailing colon."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


class SignInForm(PlainLabels, AuthenticationForm):
    pass
