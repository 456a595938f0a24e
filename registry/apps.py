from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Adapter registry"

    def ready(self) -> None:
        from registry import health

        health.connect()
