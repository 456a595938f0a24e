from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Serving control plane"

    def ready(self):
        from core import signals as core_signals
        from registry import signals as registry_signals

        # tasks: registered in every process, the web's too: serving/enqueue.py
        # sends them by the names they are registered under.
        from serving import receivers, signals, tasks  # noqa: F401
        from serving.door import receivers as door_receivers

        registry_signals.version_transitioned.connect(
            receivers.retire_when_deprecated, dispatch_uid="serving.retire_when_deprecated"
        )
        registry_signals.version_transitioned.connect(
            receivers.settle_adoptions, dispatch_uid="serving.settle_adoptions"
        )
        signals.reconcile_finished.connect(
            door_receivers.sync_after_reconcile, dispatch_uid="serving.door.sync"
        )
        core_signals.user_access_ended.connect(
            receivers.end_person_keys, dispatch_uid="serving.end_person_keys"
        )
        core_signals.service_account_deactivated.connect(
            receivers.end_service_account_keys, dispatch_uid="serving.end_service_account_keys"
        )
        core_signals.membership_changed.connect(
            receivers.resync_on_membership, dispatch_uid="serving.resync_on_membership"
        )
        signals.served_version_changed.connect(
            receivers.resync_on_served_change, dispatch_uid="serving.resync_on_served_change"
        )
        core_signals.health_check.connect(receivers.open_doors, dispatch_uid="serving.open_doors")
        core_signals.audit_chain_restored.connect(
            receivers.hold_after_restore, dispatch_uid="serving.hold_after_restore"
        )
