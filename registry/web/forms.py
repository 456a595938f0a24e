"""Input forms for the web pages. They check shape only (required, lengths,
choices); every rule about who may do what, and what an artifact must be,
belongs to the services the views call."""

from __future__ import annotations

from django import forms
from django.conf import settings

from core.forms import PlainLabels
from core.models import Ability
from registry.models import SERVED_NAME_PATTERN


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    widget = MultipleFileInput

    def clean(self, data, initial=None):
        single = super().clean
        if isinstance(data, list | tuple):
            if not data and self.required:
                raise forms.ValidationError(self.error_messages["required"], code="required")
            return [single(item, initial) for item in data]
        return [single(data, initial)]


class UploadVersionForm(PlainLabels, forms.Form):
    # The form's metaclass moves declared fields into base_fields, so this does
    # not shadow Form.files (the uploaded files) that the stubs see.
    files = MultipleFileField(  # type: ignore[assignment]
        label="Adapter archive or files",
        help_text=(
            "A .tar.gz or .zip of the adapter folder, or adapter_config.json together with "
            "adapter_model.safetensors."
        ),
        error_messages={"required": "Choose an archive or the adapter's files to upload."},
    )


class TransitionForm(PlainLabels, forms.Form):
    action = forms.CharField(max_length=32)
    comment = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Comment",
    )


class AdapterCreateForm(PlainLabels, forms.Form):
    department = forms.ChoiceField(label="Department")
    name = forms.SlugField(
        max_length=100,
        help_text="Lowercase letters, digits, '-' or '_'. Unique within the department.",
    )
    base_model = forms.CharField(
        max_length=300, help_text="The base model it targets, as vLLM serves it."
    )
    served_name = forms.RegexField(
        regex=SERVED_NAME_PATTERN,
        required=False,
        max_length=128,
        help_text='What clients put in "model". Defaults to the name.',
        error_messages={
            "invalid": "Use letters, digits, '.', '_' or '-', starting with a letter or digit."
        },
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    owners = forms.CharField(
        required=False,
        help_text="Usernames separated by commas. Defaults to you.",
    )

    def __init__(self, *args, departments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["department"].choices = [(d.slug, d.name) for d in departments]

    def clean_owners(self) -> list[str]:
        raw = self.cleaned_data["owners"]
        return [name.strip() for name in raw.split(",") if name.strip()]


class TokenCreateForm(PlainLabels, forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. “nightly-training”.")
    department = forms.ChoiceField(label="Department")
    abilities = forms.MultipleChoiceField(
        choices=Ability.choices,
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Pick at least one ability."},
    )
    expires_in_days = forms.IntegerField(
        label="Expires in (days)",
        min_value=1,
        initial=settings.API_TOKEN_DEFAULT_DAYS,
    )

    def __init__(self, *args, departments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["department"].choices = [(d.slug, d.name) for d in departments]
        self.fields["expires_in_days"].widget.attrs["max"] = settings.API_TOKEN_MAX_DAYS
