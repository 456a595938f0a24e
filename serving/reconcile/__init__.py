"""The worker side that keeps replicas as recorded: the reconcile tick
(`tick.py`: repairs, the sampled weight check, finishing rollouts' deferred
steps). Celery runs it through `serving/tasks.py`; `manage.py reconcile` too."""
