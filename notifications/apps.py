from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications and webhooks"

    def ready(self):
        from core import signals as core_signals
        from notifications import receivers, tasks  # noqa: F401 - enqueue finds tasks by name
        from serving import signals as serving_signals

        # Every event the product tells about is already an audit event, written in
        # the transaction of its change: the outbox row joins that transaction.
        core_signals.audit_recorded.connect(
            receivers.record_event, dispatch_uid="notifications.record_event"
        )
        serving_signals.drift_found.connect(
            receivers.record_drift, dispatch_uid="notifications.record_drift"
        )
