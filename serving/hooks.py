"""Extension points for other parts of the product.

after_served_version_changed: hook(deployment, adapter, version_or_None), called
inside the transaction that changes what a deployment serves (MLflow aliases
subscribe here). Hooks must only enqueue work with transaction.on_commit.
"""

after_served_version_changed: list = []
