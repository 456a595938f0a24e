"""MLflow lineage both ways.

In: register an adapter version straight from a training run (runs.py reads the
run, lineage.register_from_run ingests its artifact through the normal path).
Out: mirror adapters, versions, their status and per-deployment aliases into the
MLflow Model Registry (mirror.py, an outbox run by tasks.py, caught up by the
`mlflow_resync` command and a beat task).

Everything is off while settings.MLFLOW_TRACKING_URI is empty.
"""
