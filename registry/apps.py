from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Adapter registry"

    def ready(self):
        from registry.mlflow import wiring

        wiring.connect()
