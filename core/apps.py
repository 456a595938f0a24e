from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Departments, people and audit"

    def ready(self):
        from core.api import strict_strings

        strict_strings.install()

        from django.contrib.auth.signals import user_logged_in

        from core.sessions import session_started

        user_logged_in.connect(session_started, dispatch_uid="core.session_started")
