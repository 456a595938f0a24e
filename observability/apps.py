from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Observability and capacity planning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.signals import health_check
        from observability import selectors, services
        from serving.capacity import residency_provider_register
        from serving.signals import reconcile_finished
        from serving.token_usage import metering_status_register, tokens_reader_register

        reconcile_finished.connect(
            services.reconcile_finished, dispatch_uid="observability.reconcile"
        )
        # What serving's capacity view asks of vLLM's metrics: a provider, not a signal.
        residency_provider_register(selectors.lora_residency)
        # What limits at the door read: tokens per key and per department.
        tokens_reader_register(selectors.tokens_used_since)
        # Whether each deployment is metered at all: its replicas' spans arrive.
        metering_status_register(selectors.metering_statuses)
        health_check.connect(selectors.metering_health, dispatch_uid="observability.metering")
