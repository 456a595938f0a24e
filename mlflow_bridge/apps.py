from django.apps import AppConfig


class MlflowBridgeConfig(AppConfig):
    name = "mlflow_bridge"
    verbose_name = "MLflow lineage and mirror"

    def ready(self):
        from mlflow_bridge import receivers

        receivers.connect()
