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

        from registry.mlflow.services import mirror_alias_clear, mirror_alias_set
        from serving import hooks as serving_hooks

        def move_mlflow_alias(deployment, adapter, version):
            # MLflow answers "what is in production?" with what the deployment serves.
            if version is None:
                mirror_alias_clear(deployment_name=deployment.name, adapter=adapter)
            else:
                mirror_alias_set(deployment_name=deployment.name, adapter=adapter, version=version)

        serving_hooks.after_served_version_changed.append(move_mlflow_alias)
