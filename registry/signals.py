"""What the registry tells the rest of the product. The registry never imports
serving or the MLflow app; they connect to these in their AppConfig.ready().

Receivers run inside the change's transaction and must only record rows or
enqueue work with transaction.on_commit, never call out over the network.
"""

from django.dispatch import Signal

# version=<AdapterVersion>; sent once, in the registration transaction.
version_registered = Signal()

# version=<AdapterVersion>, previous=<status it left>; sent in the transition's transaction.
version_transitioned = Signal()
