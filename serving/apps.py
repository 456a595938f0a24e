from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Serving control plane"

    def ready(self):
        from registry import signals as registry_signals
        from serving import receivers, signals
        from serving.gateway import receivers as gateway_receivers

        registry_signals.version_transitioned.connect(
            receivers.retire_when_deprecated, dispatch_uid="serving.retire_when_deprecated"
        )
        registry_signals.version_transitioned.connect(
            receivers.settle_adoptions, dispatch_uid="serving.settle_adoptions"
        )
        signals.reconcile_finished.connect(
            gateway_receivers.sync_after_reconcile, dispatch_uid="serving.gateway.sync"
        )
