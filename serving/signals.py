"""What serving tells the rest of the product.

Receivers run inside the transaction that changes what a deployment serves and
must only record rows or enqueue work with transaction.on_commit.
"""

from django.dispatch import Signal

# deployment=<Deployment>, adapter=<Adapter>, version=<AdapterVersion or None when retired>.
served_version_changed = Signal()

# deployment=<Deployment>, seconds=<float>, ok=<bool>; sent after each reconcile of
# a deployment, outside any transaction, with send_robust: a receiver that fails
# is logged and never breaks the reconcile.
reconcile_finished = Signal()

# deployment_ids=<iterable of ids>: what these deployments' front doors enforce
# changed (keys, grants, limits, what they serve). The request side sends it; the
# worker side's receiver sends each door its table after the commit
# (serving.receivers.sync_doors), so that services never import the tasks.
door_access_changed = Signal()

# rollout_id=<int>: a committed rollout waits for a worker. The receiver sends
# its task and answers whether the broker took it (serving.receivers.send_rollout).
rollout_ready = Signal()

# deployment_id=<int>: replicas were discovered, new or back at an old address
# (serving.discovery.kubernetes), after the commit. The receiver sends a
# reconcile of the deployment, which loads what they should serve.
replicas_became_ready = Signal()
