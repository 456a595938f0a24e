from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Adapter registry"

    def ready(self):
        from registry import receivers

        receivers.connect()
