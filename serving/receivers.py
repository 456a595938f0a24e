"""Serving's answers to other apps' signals (connected in ServingConfig.ready)."""

from __future__ import annotations

from registry.models import VersionStatus


def retire_when_deprecated(sender, *, version, previous, **kwargs) -> None:
    from serving.services.promotions import retire_version_everywhere

    if version.status in (VersionStatus.DEPRECATED, VersionStatus.ARCHIVED):
        # Retire rollouts are recorded in the transition's transaction and run after commit.
        retire_version_everywhere(version)


def settle_adoptions(sender, *, version, previous, **kwargs) -> None:
    from serving.services.adoptions import adoption_settle

    adoption_settle(version=version)
