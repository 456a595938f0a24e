from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Observability and capacity planning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from observability import selectors, services
        from serving.signals import lora_residency_wanted, reconcile_finished

        reconcile_finished.connect(
            services.reconcile_finished, dispatch_uid="observability.reconcile"
        )
        lora_residency_wanted.connect(
            selectors.lora_residency, dispatch_uid="observability.lora_residency"
        )
