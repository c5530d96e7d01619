"""The form of "Your keys": a new key's name, and every capability or a chosen few."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from django import forms

from capabilities.work.registry import CapabilitySpec


class Reach(StrEnum):
    """What a new key may call."""

    ALL = "all"
    """Every capability its owner may call, now and later (no scopes)."""
    CHOSEN = "chosen"
    """Only the capabilities chosen (its scopes)."""


class NewKeyForm(forms.Form):
    """A key's name and reach; its scopes offered from what the user may call."""

    name = forms.CharField(
        max_length=200, help_text="Which agent or script holds it: for you to tell keys apart."
    )
    reach = forms.ChoiceField(
        choices=[
            (Reach.ALL.value, "Every capability you may call"),
            (Reach.CHOSEN.value, "Only the capabilities chosen below"),
        ],
        initial=Reach.ALL.value,
        widget=forms.RadioSelect,
    )
    scopes = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        error_messages={
            # A name offered to nobody, or one this user may not call: a forged POST.
            "invalid_choice": (
                "You may not call %(value)s, so no key of yours may be scoped to it."
            ),
        },
    )

    def __init__(self, *args: Any, offered: Sequence[CapabilitySpec], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scopes = self.fields["scopes"]
        assert isinstance(scopes, forms.MultipleChoiceField)
        scopes.choices = [(spec.name, spec.name) for spec in offered]

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if cleaned.get("reach") == Reach.CHOSEN and not cleaned.get("scopes"):
            self.add_error("scopes", "Choose at least one capability, or every one.")
        return cleaned

    def chosen_scopes(self) -> list[str]:
        """The new key's scopes (after `is_valid`): none when it may call everything."""
        if self.cleaned_data["reach"] == Reach.ALL:
            return []
        return list(self.cleaned_data["scopes"])
