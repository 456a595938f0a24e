from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "observability"
    verbose_name = "Observability and capacity planning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from observability.web.panels import adapter_usage_panel
        from registry import hooks

        if adapter_usage_panel not in hooks.adapter_page_panels:
            hooks.adapter_page_panels.append(adapter_usage_panel)
