"""Input forms for the serving pages: shape only. Who may promote, and whether
a version fits a deployment, are the services' and the gate's to say."""

from __future__ import annotations

from django import forms

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
