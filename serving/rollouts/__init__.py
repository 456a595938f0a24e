"""The worker side of a rollout: the engine that stages, loads and verifies a
version on a deployment's replicas (`engine.py`), the steps its swaps and the
traffic canary share (`steps.py`), the canary (`canary.py`) and the sweeper
that sends a stalled rollout again (`sweep.py`). The request side that records
a rollout is `serving/services/rollout_requests.py` and `promotions.py`; Celery runs
the worker through `serving/tasks.py`."""
