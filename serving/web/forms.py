"""Input forms for the serving pages: shape only. Who may promote, and whether
a version fits a deployment, are the services' and the gate's to say."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator

from core.forms import PlainLabels


class PromoteForm(PlainLabels, forms.Form):
    deployment = forms.ChoiceField(
        label="Deployment", error_messages={"required": "Choose a deployment."}
    )
    canary = forms.BooleanField(
        required=False,
        label="Canary: load and verify one replica first, then the rest",
    )
    # A traffic canary: both or neither (the service says what is wrong).
    canary_share = forms.IntegerField(
        required=False, min_value=1, max_value=50, label="Canary share of the traffic (%)"
    )
    canary_bake_seconds = forms.IntegerField(
        required=False, min_value=1, label="Canary bake time (seconds)"
    )

    def __init__(self, *args, deployments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["deployment"].choices = [
            (d.name, f"{d.name} ({d.environment})") for d in deployments
        ]
        self.fields["deployment"].error_messages["invalid_choice"] = "Choose a listed deployment."


class PromotionReviewForm(PlainLabels, forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)


def _bound_days(field: forms.IntegerField, limit: int) -> None:
    """A lifetime in days up to a setting, read when the form is made (tests change it)."""
    field.max_value = limit
    field.validators.append(MaxValueValidator(limit))
    field.widget.attrs["max"] = limit
    field.initial = min(90, limit)


class InferenceKeyForm(PlainLabels, forms.Form):
    name = forms.CharField(max_length=100, help_text="What calls with it, e.g. “chat frontend”.")
    department = forms.ChoiceField(label="Calls as department")
    holder = forms.ChoiceField(
        label="Held by",
        choices=[
            ("person", "Me (ends when I leave)"),
            ("department", "The department"),
            ("service_account", "A service account of the department"),
        ],
        initial="person",
    )
    service_account = forms.CharField(
        required=False, max_length=64, label="Service account (its name)"
    )
    expires_in_days = forms.IntegerField(label="Expires in (days)", min_value=1, initial=90)

    def __init__(self, *args, departments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["department"].choices = [(d.slug, d.name) for d in departments]
        _bound_days(self.fields["expires_in_days"], settings.SERVING_INFERENCE_KEY_MAX_DAYS)


class GrantRequestForm(PlainLabels, forms.Form):
    served_name = forms.CharField(
        max_length=128,
        label="Adapter (its served name)",
        help_text="The other department tells you the name clients send as “model”.",
    )
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    expires_in_days = forms.IntegerField(label="For (days)", min_value=1, initial=90)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _bound_days(self.fields["expires_in_days"], settings.SERVING_GRANT_MAX_DAYS)


class GrantDecisionForm(PlainLabels, forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", "Approve"), ("refuse", "Refuse"), ("revoke", "Revoke")]
    )
    comment = forms.CharField(required=False, max_length=2000)
