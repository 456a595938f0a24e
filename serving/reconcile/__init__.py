"""The worker side that keeps replicas as recorded: the reconcile tick.
`tick.py` runs observe -> plan -> repair -> write; `repairs.py` plans and runs
the repairs, `weight_check.py` the sampled fingerprint probes, `deferred.py`
finishes rollouts' deferred steps, `jobs.py` holds what they share. Celery
runs it through `serving/tasks.py`; `manage.py reconcile` too."""
