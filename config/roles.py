"""Which secrets each process of the product reads (PROCESS_ROLE), read from the code:
a deployment hands each workload only these (deploy/kustomize, docker-compose.yml),
and settings require at start-up exactly the ones its process cannot run without.
No role ("all": `make run`, the tests) reads and requires everything, as before.

- web: sessions and CSRF (DJANGO_SECRET_KEY), uploads (S3), MLflow lineage,
  sign-in (OIDC client secret), /metrics and MLflow webhooks.
- worker-rollouts, worker-reconcile: stage files from the store (S3) and call vLLM
  with the deployment's key (FIELD_ENCRYPTION_KEY decrypts it).
- worker-housekeeping: the MLflow mirror and registrations from runs (S3 sources,
  MLflow token), pruning, and the SSO check, which redeems refresh tokens sealed
  with a key derived from DJANGO_SECRET_KEY (sso/checks.py) with the client secret.
- beat: only schedules, through the broker.
- discovery (manage.py watch_replicas): writes replica rows, enqueues a reconcile;
  it never loads the deployment's vLLM key (serving/discovery/kubernetes.py).
- migrate: the tables' owner (the Secret's MIGRATE_DATABASE_URL, as DATABASE_URL).
- gateway: a door (HAProxy with its agent, which pulls its state from web); no secret.
- door-credential: writes the doors' token (manage.py door_credential), which is
  derived from DJANGO_SECRET_KEY; no database (Compose's one-shot service).
"""

from __future__ import annotations

ALL = "all"

_STORE = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
_WORKER = {"FIELD_ENCRYPTION_KEY", "DATABASE_URL", "CELERY_BROKER_URL"}

# Without these the process cannot do its work: settings stop start-up without them.
REQUIRED: dict[str, frozenset[str]] = {
    "web": frozenset({"DJANGO_SECRET_KEY", *_WORKER}),
    "worker-rollouts": frozenset(_WORKER),
    "worker-reconcile": frozenset(_WORKER),
    "worker-housekeeping": frozenset({"DJANGO_SECRET_KEY", *_WORKER}),
    "beat": frozenset({"CELERY_BROKER_URL"}),
    "discovery": frozenset({"DATABASE_URL", "CELERY_BROKER_URL"}),
    "migrate": frozenset({"DATABASE_URL"}),
    "gateway": frozenset(),
    "door-credential": frozenset({"DJANGO_SECRET_KEY"}),
}
# Read when the deployment has them: S3 keys (else the SDK's own credentials),
# the MLflow token, the OIDC client secret (required where SSO is on), the
# metrics token and the webhook secret (else those endpoints are off).
OPTIONAL: dict[str, frozenset[str]] = {
    "web": frozenset(
        {
            *_STORE,
            "MLFLOW_TRACKING_TOKEN",
            "OIDC_RP_CLIENT_SECRET",
            "METRICS_TOKEN",
            "MLFLOW_WEBHOOK_SECRET",
        }
    ),
    "worker-rollouts": frozenset(_STORE),
    "worker-reconcile": frozenset(_STORE),
    "worker-housekeeping": frozenset({*_STORE, "MLFLOW_TRACKING_TOKEN", "OIDC_RP_CLIENT_SECRET"}),
    "beat": frozenset(),
    "discovery": frozenset(),
    "migrate": frozenset(),
    "gateway": frozenset(),
    "door-credential": frozenset(),
}
ROLES = frozenset(REQUIRED)


def reads(role: str) -> frozenset[str]:
    """Every secret a process of `role` (not ALL) reads."""
    return REQUIRED[role] | OPTIONAL[role]


def needs(role: str, name: str) -> bool:
    """Whether a process of `role` reads the secret `name` at all."""
    return role == ALL or name in reads(role)
