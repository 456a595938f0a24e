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

# events=<list of DriftEvent>: drift the reconcile found for the first time (not
# a repeat it counted), sent in the transaction that records them
# (serving.records.drifts.DriftRecorder.flush); receivers record rows only.
drift_found = Signal()
