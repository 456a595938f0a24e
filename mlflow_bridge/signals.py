"""What the MLflow app's request side tells its worker side, so that the
services (mirror, webhooks) never import the tasks that call them.

Both are sent after the transaction commits; the receivers
(mlflow_bridge.receivers) send the task, and a broker that is down loses
nothing: the catch-up task finds the row again."""

from django.dispatch import Signal

# kind=<"version" or "alias">, pk=<the mirror row's id>: a mirror row waits.
mirror_pending = Signal()

# delivery_id=<the WebhookDelivery's id>: an accepted delivery waits.
webhook_accepted = Signal()
