from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Serving control plane"

    def ready(self):
        from registry import hooks
        from registry.models import VersionStatus
        from serving.services.promotions import retire_version_everywhere

        def retire_when_deprecated(version, previous):
            if version.status in (VersionStatus.DEPRECATED, VersionStatus.ARCHIVED):
                # Retire rollouts are recorded in the transition's transaction and run after commit.
                retire_version_everywhere(version)

        hooks.after_version_transition.append(retire_when_deprecated)
