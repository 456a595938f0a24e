from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Departments, people and audit"

    def ready(self):
        from core.api import strict_strings

        strict_strings.install()
