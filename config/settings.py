"""Settings for the adapter registry and serving control plane.

Everything that differs between a laptop and production comes from the
environment (see config/env.py and docs/operators/configuration.md). The
defaults are embedded ones: SQLite, artifacts and the Celery broker on the local
filesystem under var/ (the broker is a SQLite file there), so `make run` needs no servers.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from config import env as cfg
from config import roles

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(cfg.env.str("VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = cfg.boolean("DJANGO_DEBUG", False)
# Which process this is (config/roles.py): each gets only the secrets it reads,
# and start-up stops when one it cannot run without is missing. Unset: all of them.
PROCESS_ROLE = cfg.choice("PROCESS_ROLE", roles.ALL, {roles.ALL, *roles.ROLES})
if PROCESS_ROLE != roles.ALL:
    _missing = sorted(name for name in roles.REQUIRED[PROCESS_ROLE] if not cfg.secret(name))
    if _missing:
        raise ImproperlyConfigured(
            f"PROCESS_ROLE={PROCESS_ROLE} needs {', '.join(_missing)} (or their *_FILE)"
        )
SECRET_KEY = cfg.secret("DJANGO_SECRET_KEY") or ""
if not SECRET_KEY and PROCESS_ROLE == roles.ALL:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) must be set unless DJANGO_DEBUG=true"
        )
    SECRET_KEY = "insecure-development-key-only-for-debug"  # noqa: S105 - DEBUG only
# A role without DJANGO_SECRET_KEY leaves SECRET_KEY empty: Django then refuses
# any use of it ("must not be empty"), so a process that wrongly lacks it fails
# loudly instead of signing with a guessable key.
# Encrypts secrets kept in the database (vLLM API keys); without roles, defaults to
# one derived from SECRET_KEY. With roles it is set explicitly (config/roles.py), so
# that processes without DJANGO_SECRET_KEY share it.
FIELD_ENCRYPTION_KEY = cfg.secret("FIELD_ENCRYPTION_KEY") or ""
ALLOWED_HOSTS = cfg.env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = cfg.env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # The project package, ahead of staticfiles for its `runserver`, which
    # closes a connection whose body went unread (config/management/).
    "config",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "axes",
    "core",
    "registry",
    "serving",
    "mlflow_bridge",
    "sso",
    "observability",
    "notifications",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "core.middleware.RequestIdMiddleware",
    "core.body_limit.BodySizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "core.sessions.IdleSessionTimeout",
    "sso.middleware.SessionRefresh",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a lockout into the 429 response.
    "axes.middleware.AxesMiddleware",
]


ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "registry.context_processors.navigation",
                "notifications.context_processors.badge",
            ],
        },
    },
]

DATABASES = {"default": cfg.database(VAR_DIR / "db.sqlite3")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The embedded default has a web server and Celery workers writing one file. In
    # the default rollback-journal mode every commit costs ~16 ms of fsyncs here, and
    # a rollout makes a few dozen small commits (states, attempts), which was most of
    # promote-to-served. WAL with synchronous=NORMAL survives a crash of any process
    # (a power cut may lose the last commits, never corrupts), and readers no longer
    # block the writer.
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    )
    # A transaction that reads and then writes (update_or_create, select_for_update)
    # starts as a reader; when two try to become the writer, SQLite fails one at
    # once with "database is locked", without waiting (four rollouts at once did,
    # bench/scale_promotions.py). BEGIN IMMEDIATE takes the write lock first, so a
    # second writer waits for it (up to `timeout` seconds) instead.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    DATABASES["default"]["OPTIONS"].setdefault("timeout", 20)
    # Tests run a Celery worker in threads of the test process: the in-memory test
    # database's shared cache fails those concurrent writes at once with "database
    # table is locked" (no busy timeout applies), so tests use a file too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# --- Sign-in: local passwords and/or OpenID Connect single sign-on (sso/) ----
# Sets SSO_ENABLED, LOCAL_LOGIN, AUTHENTICATION_BACKENDS and the OIDC_* settings
# of mozilla-django-oidc; see sso/conf.py and docs/operators/configuration.md.
from sso.conf import from_env as _sso_settings  # noqa: E402
from sso.group_map import GroupMap as _GroupMap  # noqa: E402

globals().update(
    _sso_settings(client_secret_needed=roles.needs(PROCESS_ROLE, "OIDC_RP_CLIENT_SECRET"))
)
# The names above that the code reads, declared (not assigned) so that mypy's
# Django plugin knows `settings.OIDC_*`; tests/sso/test_settings.py
# checks each is really set.
SSO_ENABLED: bool
LOCAL_LOGIN: bool
OIDC_ISSUER: str
OIDC_PROVIDER_NAME: str
OIDC_RP_CLIENT_ID: str
OIDC_RP_CLIENT_SECRET: str
OIDC_GROUPS_CLAIM: str
OIDC_USERNAME_CLAIM: str
OIDC_LINK_CLAIM: str
OIDC_GROUP_MAP: _GroupMap
OIDC_VERIFY_SSL: str | bool  # requests' `verify`: a CA bundle path, or a boolean
OIDC_TIMEOUT: float
OIDC_CHECK_INTERVAL_SECONDS: int
OIDC_OP_TOKEN_ENDPOINT: str
OIDC_OP_USER_ENDPOINT: str
OIDC_OP_LOGOUT_ENDPOINT: str
# First: django-axes refuses a locked-out username or address before any
# backend looks at the password.
AUTHENTICATION_BACKENDS: list[str] = [
    "axes.backends.AxesStandaloneBackend",
    *AUTHENTICATION_BACKENDS,  # noqa: F821 - from sso.conf
]
# --- SCIM 2.0 provisioning (sso/scim/, django-scim2) under /scim/v2/ -----------
# The identity provider authenticates with a SCIM token (manage.py scim_token).
# Fixed: bounds on what a SCIM client may ask (page size, filter length), and a
# SCIM token's lifetime unless `scim_token create --days` says otherwise.
SCIM_MAX_RESULTS = 100
SCIM_FILTER_MAX_LENGTH = 1000
SCIM_TOKEN_DEFAULT_DAYS = 365
SCIM_SERVICE_PROVIDER = {
    # Resources' locations come from the request (BASE_LOCATION_GETTER); the
    # library insists on a NETLOC all the same.
    "NETLOC": "unused",
    "AUTHENTICATION_SCHEMES": [{"type": "oauthbearertoken", "name": "SCIM token"}],
    "USER_ADAPTER": "sso.scim.adapters.ScimUserAdapter",
    "GROUP_ADAPTER": "sso.scim.adapters.ScimGroupAdapter",
    "GROUP_MODEL": "sso.models.ScimGroup",
    "USER_FILTER_PARSER": "sso.scim.filters.UserFilterQuery",
    "GROUP_FILTER_PARSER": "sso.scim.filters.GroupFilterQuery",
    "SERVICE_PROVIDER_CONFIG_MODEL": "sso.scim.views.ServiceProviderConfig",
    "BASE_LOCATION_GETTER": "sso.scim.views.base_location",
    "AUTH_CHECK_MIDDLEWARE": "sso.scim.auth.ScimTokenChecked",
    "SCHEMAS_GETTER": "sso.scim.schemas.schemas_getter",
}
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = cfg.env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The image collects static files at build time, outside VAR_DIR (an emptyDir on Kubernetes).
STATIC_ROOT = Path(cfg.env.str("DJANGO_STATIC_ROOT", default=str(VAR_DIR / "staticfiles")))
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").is_dir() else []
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- HTTPS and cookies --------------------------------------------------------
# Production defaults (DJANGO_DEBUG=false) pass `manage.py check --deploy`; each
# can be turned off for a deployment that terminates TLS differently.
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads it to send X-CSRFToken
SESSION_COOKIE_SECURE = cfg.boolean("DJANGO_SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_SSL_REDIRECT = cfg.boolean("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# Probes speak plain HTTP to the pod, and so do the door agents to the web
# Service (serving/api/doors.py) and the replicas' span exporters to the OTLP
# receiver (observability/otlp.py): inside the cluster, with a token; a
# redirect to https:// would reach nothing (and lose every token's count).
SECURE_REDIRECT_EXEMPT = [r"^livez$", r"^readyz$", r"^doors/", r"^otlp/"]
SECURE_HSTS_SECONDS = cfg.integer("DJANGO_SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = cfg.boolean("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = cfg.boolean("DJANGO_SECURE_HSTS_PRELOAD", not DEBUG)
# "HTTP_X_FORWARDED_PROTO=https" behind a proxy that terminates TLS and sets that
# header (and strips it from clients); without it such a proxy causes a redirect loop.
_proxy_header = cfg.env.str("DJANGO_SECURE_PROXY_SSL_HEADER", default="")
if _proxy_header:
    _name, _, _value = _proxy_header.partition("=")
    if not _name.startswith("HTTP_") or not _value:
        raise ImproperlyConfigured(
            "DJANGO_SECURE_PROXY_SSL_HEADER must look like HTTP_X_FORWARDED_PROTO=https, "
            f"got {_proxy_header!r}"
        )
    SECURE_PROXY_SSL_HEADER = (_name, _value)

# --- Client addresses behind proxies -------------------------------------------
# How many reverse proxies (ingress, load balancer) stand between clients and
# this process, each appending to X-Forwarded-For. With N, the client is the
# N-th address from the right; whatever a client wrote to the left of it is
# ignored. 0 (the default) means REMOTE_ADDR: right when nothing is in front,
# and the only safe value when the proxies in front do not append.
TRUSTED_PROXY_COUNT = cfg.integer("TRUSTED_PROXY_COUNT", 0, minimum=0)

# --- Sessions ----------------------------------------------------------------
# A session unused for this long is ended (core.sessions); SESSION_COOKIE_AGE
# stays the absolute limit.
SESSION_IDLE_TIMEOUT_SECONDS = cfg.integer("SESSION_IDLE_TIMEOUT_SECONDS", 3600, minimum=60)

# --- Sign-in throttling (django-axes) --------------------------------------------
# Failed local sign-ins are counted per username and, separately, per client
# address (core.actors.client_address_of, as the audit log records it, behind
# TRUSTED_PROXY_COUNT proxies); either one reaching the limit locks that
# username or address out for the cool-off.
AXES_ENABLED = cfg.boolean("AXES_ENABLED", True)
AXES_FAILURE_LIMIT = cfg.integer("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=cfg.integer("AXES_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "core.actors.client_address_of"
AXES_HTTP_RESPONSE_CODE = 429

# --- Artifact storage -------------------------------------------------------
# file:///abs/path (embedded default) or s3://bucket/prefix for AWS, MinIO, Ceph RGW.
ARTIFACT_STORE_URL = cfg.url_with_scheme(
    "ARTIFACT_STORE_URL", (VAR_DIR / "artifacts").as_uri(), {"file", "s3"}
)
ARTIFACT_S3 = {
    "endpoint_url": cfg.env.str("AWS_ENDPOINT_URL", default="") or None,
    "region": cfg.env.str("AWS_REGION", default="us-east-1"),
    "access_key": cfg.secret("AWS_ACCESS_KEY_ID"),
    "secret_key": cfg.secret("AWS_SECRET_ACCESS_KEY"),
    "addressing_style": cfg.choice("AWS_S3_ADDRESSING_STYLE", "auto", {"auto", "path", "virtual"}),
    "verify_tls": cfg.env.str("AWS_CA_BUNDLE", default="")
    or cfg.boolean("AWS_S3_VERIFY_TLS", True),
    "multipart_chunk_mb": cfg.integer("AWS_S3_MULTIPART_CHUNK_MB", 16, minimum=5),
    "max_concurrency": cfg.integer("AWS_S3_MAX_CONCURRENCY", 4, minimum=1),
}

# --- Ingest of untrusted artifacts -----------------------------------------
INGEST_MAX_BYTES = cfg.integer("INGEST_MAX_BYTES", 2 * 1024**3, minimum=1024)
# Multipart framing and form fields on top of the files: a Content-Length above
# INGEST_MAX_BYTES plus this is refused with 413 before the body is read.
# Fixed: framing is small, INGEST_MAX_BYTES is the limit an operator sizes.
INGEST_MULTIPART_ALLOWANCE_BYTES = 1024**2
# A request whose Idempotency-Key another request holds waits this long for its
# result; a claim older than IDEMPOTENCY_CLAIM_STALE_SECONDS without a result
# belongs to a request that died and is taken over.
# Fixed: part of the API's contract with pipelines (docs/pipelines/api.md).
IDEMPOTENCY_WAIT_SECONDS = 60.0
IDEMPOTENCY_CLAIM_STALE_SECONDS = 3600
INGEST_MAX_ENTRIES = cfg.integer("INGEST_MAX_ENTRIES", 64, minimum=2)
# Fixed: pickle files in an adapter are refused; there is no safe reason to allow them.
INGEST_ALLOW_PICKLE = False
INGEST_STAGING_DIR = Path(cfg.env.str("INGEST_STAGING_DIR", default=str(VAR_DIR / "ingest")))
SERVING_DTYPE = cfg.choice("SERVING_DTYPE", "float16", {"float16", "bfloat16", "float32"})
# Uploads above this are spooled to disk by Django instead of held in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024**2
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024**2
FILE_UPLOAD_TEMP_DIR = str(INGEST_STAGING_DIR)
INGEST_STAGING_DIR.mkdir(parents=True, exist_ok=True)

# --- API tokens -------------------------------------------------------------
# Fixed: the lifetime a new token is offered; API_TOKEN_MAX_DAYS is the policy.
API_TOKEN_DEFAULT_DAYS = 90
API_TOKEN_MAX_DAYS = cfg.integer("API_TOKEN_MAX_DAYS", 365, minimum=1)
# Offboarding (deactivation by an admin, SCIM or the SSO check) also revokes the
# service-account tokens the person minted; off, they are listed for review.
OFFBOARDING_REVOKE_SERVICE_TOKENS = cfg.boolean("OFFBOARDING_REVOKE_SERVICE_TOKENS", False)
# Offboarding also revokes the inference keys the person issued to a department
# or to a service account (they saw each secret once); off, they are listed in
# the `user.issued_keys_kept` event for review. A person's own keys always end.
OFFBOARDING_REVOKE_ISSUED_KEYS = cfg.boolean("OFFBOARDING_REVOKE_ISSUED_KEYS", False)

# --- Celery -----------------------------------------------------------------
# The embedded default is a SQLite file (config/broker.py): no server, and a
# message is a row written in a transaction. Redis in production.
_default_broker = f"sqlite:///{VAR_DIR / 'celery-broker.sqlite3'}"
CELERY_BROKER_URL = cfg.url_with_scheme(
    "CELERY_BROKER_URL", _default_broker, {"sqlite", "redis", "rediss", "memory"}
)
if CELERY_BROKER_URL.startswith("sqlite"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # kombu polls the table when every queue is empty, by default every 1 s: on
        # average 0.5 s before a worker even sees a rollout. At 0.1 s the wait was
        # still the largest part of promote-to-served on one replica (50 ms of
        # ~200, docs/internals/rollout-speed.md); an empty poll is one indexed
        # SELECT per queue, so 50 a second cost a worker well under 1% of a core.
        "polling_interval": cfg.number("CELERY_BROKER_POLL_SECONDS", 0.02, minimum=0.01),
    }
    VAR_DIR.mkdir(parents=True, exist_ok=True)
# One queue per kind of work, each with its own worker (docs/operators/workers.md), so a
# long rollout never starves the reconcile and a slow MLflow never starves either.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [
    Queue(name) for name in ("rollouts", "reconcile", "housekeeping", CELERY_TASK_DEFAULT_QUEUE)
]
CELERY_TASK_ROUTES = {
    "serving.run_rollout": {"queue": "rollouts"},
    "serving.reconcile_*": {"queue": "reconcile"},
    "serving.sweep": {"queue": "reconcile"},
    # Who may call what, to the front doors: seconds matter, as for the reconcile.
    "serving.door_access_*": {"queue": "reconcile"},
    "serving.housekeeping": {"queue": "housekeeping"},
    # The MLflow mirror (mlflow_bridge.*), and its old names (registry.mlflow.*).
    "registry.mlflow.*": {"queue": "housekeeping"},
    "mlflow*": {"queue": "housekeeping"},
    # The periodic check against the identity provider (sso/checks.py): slow calls out.
    "sso.*": {"queue": "housekeeping"},
    # Mail and webhooks call out to servers that may be slow (bounded per call).
    "notifications.*": {"queue": "housekeeping"},
}
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = cfg.boolean("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# SIGTERM stops a worker within seconds instead of waiting for every task in hand
# (a rollout can run for minutes): with REMAP_SIGTERM=SIGQUIT in the worker's
# environment (billiard reads it at import, before this file: the Dockerfile and
# scripts/run.sh set it), SIGTERM is a cold shutdown that first waits this long for
# running tasks, then cancels them. Acked late, they are redelivered; a rollout's
# claim expires and the sweeper resumes it from its recorded state.
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = cfg.number(
    "CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT", 1.0, minimum=0.0, maximum=60.0
)

# --- MLflow lineage and mirror (mlflow_bridge/) ---------------------------
# Empty MLFLOW_TRACKING_URI turns the integration off: lineage fields can still be
# set by hand, and the health endpoint says the mirror is off.
MLFLOW_TRACKING_URI = cfg.env.str("MLFLOW_TRACKING_URI", default="").rstrip("/")
if MLFLOW_TRACKING_URI and not MLFLOW_TRACKING_URI.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        "MLFLOW_TRACKING_URI must be the http(s) URL of a tracking server, "
        f"got {MLFLOW_TRACKING_URI!r}"
    )
# Where people open the MLflow UI, if not the tracking URI (e.g. behind a proxy).
# Runs whose artifacts are file: paths are read from this host's disk: only
# under these folders (comma-separated). Empty: file: artifact locations are refused.
MLFLOW_FILE_ARTIFACT_ROOTS = [
    str(Path(p).resolve()) for p in cfg.env.list("MLFLOW_FILE_ARTIFACT_ROOTS", default=[]) if p
]
MLFLOW_UI_URL = cfg.env.str("MLFLOW_UI_URL", default="").rstrip("/") or MLFLOW_TRACKING_URI
MLFLOW_TRACKING_TOKEN = cfg.secret("MLFLOW_TRACKING_TOKEN")
MLFLOW_HTTP_TIMEOUT = cfg.integer("MLFLOW_HTTP_TIMEOUT", 15, minimum=1)
# Retries inside one call; the mirror tasks retry on top of this with their own backoff.
MLFLOW_HTTP_MAX_RETRIES = cfg.integer("MLFLOW_HTTP_MAX_RETRIES", 2, minimum=0)
MLFLOW_MIRROR_ENABLED = cfg.boolean("MLFLOW_MIRROR_ENABLED", True) and bool(MLFLOW_TRACKING_URI)
MLFLOW_MIRROR_MAX_RETRIES = cfg.integer("MLFLOW_MIRROR_MAX_RETRIES", 8, minimum=0)
MLFLOW_MIRROR_BACKOFF_SECONDS = cfg.integer("MLFLOW_MIRROR_BACKOFF_SECONDS", 10, minimum=0)
# Fixed: the longest wait between two retries of one mirror push.
MLFLOW_MIRROR_BACKOFF_MAX_SECONDS = 900
MLFLOW_MIRROR_CATCH_UP_SECONDS = cfg.integer("MLFLOW_MIRROR_CATCH_UP_SECONDS", 300, minimum=10)
# MLflow webhooks in (mlflow_bridge/webhooks.py): the secret MLflow signs deliveries
# with; empty turns the endpoint off (404). A delivery older or newer than the
# tolerance is refused, so a captured one cannot be replayed later.
MLFLOW_WEBHOOK_SECRET = cfg.secret("MLFLOW_WEBHOOK_SECRET") or ""
# Fixed: the replay window, and a cap far above any delivery's size.
MLFLOW_WEBHOOK_TOLERANCE_SECONDS = 300
MLFLOW_WEBHOOK_MAX_BYTES = 64 * 1024
# Refused deliveries are counted per source and window; a source past this many
# refusals in a window is answered 429 until the window ends, before its
# signature is checked. Each window's counts are audited once it has closed.
# Fixed: a flood guard; a well-configured MLflow is never refused at all.
MLFLOW_WEBHOOK_REFUSALS_PER_SOURCE = 20
MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS = 60
# Merged into CELERY_BEAT_SCHEDULE after the serving block, which defines it.
_MLFLOW_BEAT = {
    "mlflow-mirror-catch-up": {
        "task": "mlflow_bridge.catch_up",
        "schedule": MLFLOW_MIRROR_CATCH_UP_SECONDS,
    },
}
# --- end MLflow ---------------------------------------------------------------

# --- Notifications and webhooks (notifications/, docs/operators/notifications.md)
# Email through Django's backends. The default keeps messages in the database,
# shown on /notifications/outbox/ (`make run`); production sets
# EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend and the SMTP server.
EMAIL_BACKEND = cfg.env.str("EMAIL_BACKEND", default="notifications.mail_outbox.OutboxBackend")
EMAIL_HOST = cfg.env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = cfg.integer("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = cfg.env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = cfg.secret("EMAIL_HOST_PASSWORD") or ""
EMAIL_USE_TLS = cfg.boolean("EMAIL_USE_TLS", True)
EMAIL_USE_SSL = cfg.boolean("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are exclusive: set one.")
# A mail server that stops answering holds a worker at most this long per message.
# Fixed: an SMTP conversation that needs more than 10 s has failed.
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = cfg.env.str("DEFAULT_FROM_EMAIL", default="LoRA Registry <registry@localhost>")
# Where the links in emails point: the address people open the product at.
NOTIFICATIONS_SITE_URL = cfg.env.str("NOTIFICATIONS_SITE_URL", default="http://127.0.0.1:8000")
# One webhook delivery: connect and answer within this many seconds, or it is
# a failed attempt (retried with backoff).
NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS = cfg.number(
    "NOTIFICATIONS_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.5, maximum=60.0
)
NOTIFICATIONS_SWEEP_SECONDS = 10.0

# --- Serving control plane ---------------------------------------------------
SERVING_HTTP_TIMEOUT_SECONDS = cfg.number("SERVING_HTTP_TIMEOUT_SECONDS", 10.0, minimum=0.1)
SERVING_CONNECT_TIMEOUT_SECONDS = cfg.number("SERVING_CONNECT_TIMEOUT_SECONDS", 3.0, minimum=0.1)
# Fixed: one load call to vLLM (a LoRA load takes seconds, not a minute).
SERVING_LOAD_TIMEOUT_SECONDS = 60.0
# How long after the control plane's last probe through an adapter on a replica
# its label sets in /metrics are still taken for the probe's, not clients'
# (serving.records.own_probes): a probe's request may outlive its answer.
# Fixed: an internal bound of the reconcile's bookkeeping.
SERVING_OWN_PROBE_GRACE_SECONDS = 15.0
# Transient failures are retried with exponential backoff until this deadline.
SERVING_RETRY_DEADLINE_SECONDS = cfg.number("SERVING_RETRY_DEADLINE_SECONDS", 90.0)
SERVING_RETRY_BASE_SECONDS = cfg.number("SERVING_RETRY_BASE_SECONDS", 0.5)
SERVING_RETRY_MAX_DELAY_SECONDS = cfg.number("SERVING_RETRY_MAX_DELAY_SECONDS", 5.0)
# Unloading then loading one adapter name kills vLLM 0.32's engine when requests
# under the old LoRA id are still running as requests under the new id arrive
# (docs/upstream/vllm-unload-keyerror.md). After an unload that a load follows,
# the control plane waits until vLLM's /metrics shows no request of that name
# running or waiting, for at most SERVING_UNLOAD_SETTLE_SECONDS (then the swap
# fails rather than risk the replica). Unloads on one replica go one at a time,
# at least SERVING_UNLOAD_PACE_SECONDS apart.
# Fixed: a guard around a vLLM defect, not a choice of the operator's.
SERVING_UNLOAD_SETTLE_SECONDS = 60.0
SERVING_UNLOAD_PACE_SECONDS = 0.0
# Claims on serving work (a rollout's adapter, a reconcile's deployment) last this
# long and are renewed every third of it while the work goes on; a dead worker's
# claim is free again after at most this long.
SERVING_CLAIM_SECONDS = cfg.number("SERVING_CLAIM_SECONDS", 15.0, minimum=1)
# The sweeper (beat) re-enqueues unfinished rollouts that nobody holds and that
# were not enqueued in the last SERVING_SWEEP_AFTER_SECONDS.
SERVING_SWEEP_INTERVAL_SECONDS = cfg.number("SERVING_SWEEP_INTERVAL_SECONDS", 5.0, minimum=1)
SERVING_SWEEP_AFTER_SECONDS = cfg.number("SERVING_SWEEP_AFTER_SECONDS", 30.0, minimum=1)
SERVING_RECONCILE_INTERVAL_SECONDS = cfg.number(
    "SERVING_RECONCILE_INTERVAL_SECONDS", 10.0, minimum=1
)
# Fixed: housekeeping of the adapter volume (docs/operators/retention.md).
SERVING_STAGED_GRACE_SECONDS = 24 * 3600
# A KServe manifest rendered within this many days keeps the staged folders it names
# (the latest render of each deployment keeps its folders whatever its age).
# Fixed: housekeeping of the adapter volume (docs/operators/retention.md).
SERVING_MANIFEST_PIN_DAYS = 30
# Folders besides a deployment's adapter volume that the control plane may read
# adapters from when adopting one already served there (serving/services/adoptions.py).
SERVING_ADOPTION_ROOTS = [
    str(Path(p).resolve()) for p in cfg.env.list("SERVING_ADOPTION_ROOTS", default=[]) if p
]
# A staged folder whose files' sizes and mtimes are as when it was last hashed is
# trusted for this long before a repair hashes it again.
# Fixed: an internal schedule of the repairs.
SERVING_STAGED_REVERIFY_SECONDS = 24 * 3600
# Reconcile repairs: how many HTTP calls at once in all, and to one replica.
SERVING_RECONCILE_CONCURRENCY = cfg.integer("SERVING_RECONCILE_CONCURRENCY", 32, minimum=1)
SERVING_RECONCILE_PER_REPLICA = cfg.integer("SERVING_RECONCILE_PER_REPLICA", 4, minimum=1)
# Placement (serving/rules/placement_plan.py, docs/operators/placement.md): an adapter with
# min_replicas/max_replicas follows its demand (running + waiting in vLLM's
# /metrics) smoothed over SERVING_PLACEMENT_WINDOW_SECONDS, one replica per
# SERVING_PLACEMENT_DEMAND_PER_REPLICA of it; it gives up a replica only after
# fewer were wanted for SERVING_PLACEMENT_QUIET_SECONDS; one reconcile tick starts
# at most SERVING_PLACEMENT_CHURN_BUDGET loads plus unloads (0: no limit).
SERVING_PLACEMENT_WINDOW_SECONDS = cfg.number("SERVING_PLACEMENT_WINDOW_SECONDS", 60.0, minimum=0)
SERVING_PLACEMENT_QUIET_SECONDS = cfg.number("SERVING_PLACEMENT_QUIET_SECONDS", 300.0, minimum=0)
SERVING_PLACEMENT_CHURN_BUDGET = cfg.integer("SERVING_PLACEMENT_CHURN_BUDGET", 32, minimum=0)
SERVING_PLACEMENT_DEMAND_PER_REPLICA = cfg.number(
    "SERVING_PLACEMENT_DEMAND_PER_REPLICA", 1.0, minimum=0.01
)
# Fixed: the reconcile's recorded HTTP attempts are pruned after two weeks.
SERVING_ATTEMPT_RETENTION_DAYS = 14
# A replica's probe (serving/rules/probe.py) matches the version's fingerprint when no
# token's logprob differs by more than this. Measured with bench/fingerprint_spread.py
# on real vLLM (CPU, tiny float32 model): the same files give exactly 0 across
# replicas, after a reload, on 2 threads and under traffic; other seeds change the
# tokens (inf); the same weights scaled by 1% move 1.76e-3, by 0.1% 1.74e-4. So 1e-3
# catches a 1% change and leaves room for rounding that this machine does not show.
# GPUs in float16/bfloat16 batch differently: measure there and raise it if needed.
SERVING_FINGERPRINT_TOLERANCE = cfg.number("SERVING_FINGERPRINT_TOLERANCE", 1e-3, minimum=0)
# Adapters whose weights the reconcile checks on each replica each tick (one greedy
# completion each), rotating through the replica's adapters; 0 turns the check off.
SERVING_FINGERPRINT_SAMPLE = cfg.integer("SERVING_FINGERPRINT_SAMPLE", 2, minimum=0)
# The front door's settings were SERVING_GATEWAY*: the old names still work, with
# a warning at start-up (docs/operators/configuration.md#front-door-haproxy).
cfg.accept_renamed(
    {
        "SERVING_GATEWAYS": "SERVING_DOORS",
        "SERVING_GATEWAY_DIR": "SERVING_DOOR_DIR",
        "SERVING_GATEWAY_URLS": "SERVING_DOOR_URLS",
        "SERVING_GATEWAY_MAX_BODY_BYTES": "SERVING_DOOR_MAX_BODY_BYTES",
        "SERVING_GATEWAY_METRICS": "SERVING_DOOR_METRICS",
        "SERVING_GATEWAY_DRAIN_SECONDS": "SERVING_DOOR_DRAIN_SECONDS",
        "SERVING_GATEWAY_HOLD_SECONDS": "SERVING_DOOR_HOLD_SECONDS",
    }
)
# Variables no longer read (issue 44: fewer knobs): their settings above are
# constants now. One still set warns at start-up (FixedSettingWarning) and changes nothing.
cfg.warn_fixed(
    {
        "API_TOKEN_DEFAULT_DAYS": "fixed at 90 (a token's lifetime unless asked; "
        "API_TOKEN_MAX_DAYS is the limit)",
        "IDEMPOTENCY_WAIT_SECONDS": "fixed at 60",
        "IDEMPOTENCY_CLAIM_STALE_SECONDS": "fixed at 3600",
        "INGEST_MULTIPART_ALLOWANCE_BYTES": "fixed at 1 MiB (size INGEST_MAX_BYTES instead)",
        "INGEST_ALLOW_PICKLE": "pickle files are always refused",
        "MLFLOW_MIRROR_BACKOFF_MAX_SECONDS": "fixed at 900",
        "MLFLOW_WEBHOOK_TOLERANCE_SECONDS": "fixed at 300",
        "MLFLOW_WEBHOOK_MAX_BYTES": "fixed at 65536",
        "MLFLOW_WEBHOOK_REFUSALS_PER_SOURCE": "fixed at 20",
        "MLFLOW_WEBHOOK_REFUSAL_WINDOW_SECONDS": "fixed at 60",
        "EMAIL_TIMEOUT": "fixed at 10",
        "SERVING_LOAD_TIMEOUT_SECONDS": "fixed at 60",
        "SERVING_OWN_PROBE_GRACE_SECONDS": "fixed at 15",
        "SERVING_UNLOAD_SETTLE_SECONDS": "fixed at 60",
        "SERVING_UNLOAD_PACE_SECONDS": "fixed at 0",
        "SERVING_STAGED_GRACE_SECONDS": "fixed at 86400",
        "SERVING_MANIFEST_PIN_DAYS": "fixed at 30",
        "SERVING_STAGED_REVERIFY_SECONDS": "fixed at 86400",
        "SERVING_ATTEMPT_RETENTION_DAYS": "fixed at 14",
        "SERVING_ACCESS_TICK_SECONDS": "fixed at 10",
        "KUBERNETES_REQUEST_TIMEOUT_SECONDS": "fixed at 10",
        "KUBERNETES_DEPLOYMENTS_REFRESH_SECONDS": "fixed at 30",
        "OBSERVABILITY_VLLM_METRICS_TIMEOUT_SECONDS": "fixed at 3",
        "OBSERVABILITY_VLLM_METRICS_MAX_BYTES": "fixed at 2 MiB",
        "OBSERVABILITY_OTLP_MAX_BODY_BYTES": "fixed at 4 MiB",
        "OBSERVABILITY_METERED_REQUEST_DAYS": "fixed at 35",
        "OBSERVABILITY_IDLE_DAYS": "fixed at 14",
        "PLANNER_USE_CASES": "fixed at 10 (the planner page's input can be edited)",
        "OIDC_TIMEOUT_SECONDS": "fixed at 10",
        "OIDC_CLOCK_SKEW_SECONDS": "fixed at 30",
        "SCIM_MAX_RESULTS": "fixed at 100",
        "SCIM_FILTER_MAX_LENGTH": "fixed at 1000",
        "SCIM_TOKEN_DEFAULT_DAYS": "fixed at 365 (`manage.py scim_token create --days` "
        "sets another)",
    }
)
# The front door (serving/door/, docs/door.md): one HAProxy per deployment
# named in SERVING_DOORS ("local-cpu=127.0.0.1:8200,prod=0.0.0.0:8080": where
# each listens), its files in SERVING_DOOR_DIR/<deployment>/. Empty: no front
# door, clients call the replicas. A swap waits at most SERVING_DOOR_DRAIN_SECONDS
# for a replica's requests in flight to finish before it unloads the adapter there.
SERVING_DOOR_DIR = Path(cfg.env.str("SERVING_DOOR_DIR", default=str(VAR_DIR / "gateway")))
SERVING_DOORS = cfg.env.dict("SERVING_DOORS", default={})
# "prod=pull": prod's doors pull their state (serving/door/agent.py, any number
# of them, docs/door.md#doors-that-pull); no worker drives them. A door routes
# at most SERVING_DOOR_LEASE_SECONDS past its last exchange with the control
# plane, and a rollout waits that long at most for a door that went silent.
SERVING_DOOR_LEASE_SECONDS = cfg.number(
    "SERVING_DOOR_LEASE_SECONDS", 10.0, minimum=1.0, maximum=120.0
)
# The URL clients use to reach each front door ("prod=https://llm.example.com"),
# shown on the pages; where unset, http:// and the address it listens on.
SERVING_DOOR_URLS = cfg.env.dict("SERVING_DOOR_URLS", default={})
# The runtime API is a UNIX socket in SERVING_DOOR_DIR only: whatever drives a
# door shares that directory (Kubernetes: an emptyDir in the gateway's pod). The
# TCP form (SERVING_GATEWAY_ADMIN) was an unauthenticated admin port, and
# HAProxy 2.6 serves a TCP stats socket in clear even when told `ssl`: refused.
if cfg.env.str("SERVING_GATEWAY_ADMIN", default=""):
    raise ImproperlyConfigured(
        "SERVING_GATEWAY_ADMIN (the runtime API over TCP) is removed: drive the front "
        "door through its UNIX socket in SERVING_DOOR_DIR (docs/door.md)."
    )
# The largest request body the door takes (it buffers the whole body to read
# `model`): 1 MiB holds a 128k-token prompt; a larger one gets a 413. Each request
# in flight costs HAProxy about twice this in buffers.
SERVING_DOOR_MAX_BODY_BYTES = cfg.integer(
    "SERVING_DOOR_MAX_BODY_BYTES", 1024 * 1024, minimum=16 * 1024
)
# Where each door's Prometheus exporter listens ("local-cpu=127.0.0.1:8201"): an
# internal address, apart from the clients' port. Empty: no exporter.
SERVING_DOOR_METRICS = cfg.env.dict("SERVING_DOOR_METRICS", default={})
SERVING_DOOR_DRAIN_SECONDS = cfg.number("SERVING_DOOR_DRAIN_SECONDS", 60.0, minimum=0)
# A swap on the only replica that serves an adapter: the door holds the adapter's
# new requests meanwhile (docs/door.md#holding), each at most this long, after
# which it is routed as the door routes then. 0: no hold (the swap's gap fails them).
# A change takes effect at the door's next reload (it is in haproxy.cfg).
SERVING_DOOR_HOLD_SECONDS = cfg.number("SERVING_DOOR_HOLD_SECONDS", 20.0, minimum=0, maximum=300)
# The most requests one inference key has in flight at the door (a 429 past it,
# before the body is read), and the most connections from one address (0: no
# limit; set it to 0 where a router stands in front, for every client then has
# the router's address). Read by HAProxy at its next reload (docs/door.md#memory).
SERVING_DOOR_KEY_CONCURRENCY = cfg.integer("SERVING_DOOR_KEY_CONCURRENCY", 32, minimum=1)
SERVING_DOOR_CONNECTIONS_PER_SOURCE = cfg.integer(
    "SERVING_DOOR_CONNECTIONS_PER_SOURCE", 256, minimum=0
)
# TLS at the door (docs/door.md#tls): "prod=/etc/door-tls/tls.pem", a PEM file
# with the certificate and its key, or the certificate with its key beside it
# as <file>.key (cert-manager's Secret, its two entries mounted so). A door
# without one listens in plain HTTP (make run, on loopback).
SERVING_DOOR_CERTIFICATES = cfg.env.dict("SERVING_DOOR_CERTIFICATES", default={})
for _deployment, _pem in SERVING_DOOR_CERTIFICATES.items():
    if not Path(_pem).is_absolute():
        raise ImproperlyConfigured(
            f"SERVING_DOOR_CERTIFICATES: {_deployment}'s certificate must be an absolute path, "
            f"got {_pem!r}"
        )
# A deployment's doors that count requests per minute together, with HAProxy's
# peers (docs/door.md#peers): "prod=door-0@door-0.doors:10000;door-1@door-1.doors:10000".
# This door is the one named SERVING_DOOR_PEER_NAME (default: the host's name,
# a StatefulSet pod's). A deployment not listed has one door, counting alone.
SERVING_DOOR_PEERS = cfg.peers("SERVING_DOOR_PEERS")
SERVING_DOOR_PEER_NAME = cfg.env.str("SERVING_DOOR_PEER_NAME", default="") or socket.gethostname()
# Behind a front door, a swap of an adapter placement holds on fewer replicas than
# the deployment has loads the new version on others first and moves the traffic
# there (make before break); the old version stays loaded where it was, drained, for
# SERVING_ROLLBACK_RETAIN_SECONDS, so that a rollback in that time is a switch of
# traffic, not a reload (serving/rollouts/engine.py, docs/door.md).
SERVING_ROLLBACK_RETAIN_SECONDS = cfg.number("SERVING_ROLLBACK_RETAIN_SECONDS", 600.0, minimum=0)
# A traffic canary (serving/rollouts/canary.py, docs/door.md#canary): its bake
# time is stated per rollout, at most SERVING_CANARY_MAX_BAKE_SECONDS. Its gates:
# at least SERVING_CANARY_MIN_REQUESTS to the canary before it is judged; its error
# rate at most SERVING_CANARY_MAX_ERROR_RATE_INCREASE above the old version's; its
# mean response time at most SERVING_CANARY_MAX_LATENCY_RATIO times the old one's
# (+50 ms).
SERVING_CANARY_MAX_BAKE_SECONDS = cfg.integer("SERVING_CANARY_MAX_BAKE_SECONDS", 3600, minimum=1)
SERVING_CANARY_MIN_REQUESTS = cfg.integer("SERVING_CANARY_MIN_REQUESTS", 20, minimum=1)
SERVING_CANARY_MAX_ERROR_RATE_INCREASE = cfg.number(
    "SERVING_CANARY_MAX_ERROR_RATE_INCREASE", 0.02, minimum=0, maximum=1
)
SERVING_CANARY_MAX_LATENCY_RATIO = cfg.number("SERVING_CANARY_MAX_LATENCY_RATIO", 1.5, minimum=1)
# Who may call what at the front door (docs/operators/keys-and-grants.md): an
# inference key lives at most SERVING_INFERENCE_KEY_MAX_DAYS, a grant to call
# another department's adapter at most SERVING_GRANT_MAX_DAYS. Every
# SERVING_ACCESS_TICK_SECONDS the grants past their end are expired and the doors
# that served them are told (keys carry their own expiry to the door).
SERVING_INFERENCE_KEY_MAX_DAYS = cfg.integer("SERVING_INFERENCE_KEY_MAX_DAYS", 365, minimum=1)
SERVING_GRANT_MAX_DAYS = cfg.integer("SERVING_GRANT_MAX_DAYS", 365, minimum=1)
# Fixed: an internal schedule (keys carry their own expiry to the door).
SERVING_ACCESS_TICK_SECONDS = 10.0
# Kubernetes replica discovery (manage.py watch_replicas). "auto": in-cluster
# credentials when running in a pod, else the kubeconfig.
KUBERNETES_AUTH = cfg.choice("KUBERNETES_AUTH", "auto", {"auto", "in-cluster", "kubeconfig"})
KUBERNETES_KUBECONFIG = cfg.env.str("KUBERNETES_KUBECONFIG", default="")
KUBERNETES_CONTEXT = cfg.env.str("KUBERNETES_CONTEXT", default="")
# The API server closes each watch after this; the watch resumes from its resourceVersion.
KUBERNETES_WATCH_TIMEOUT_SECONDS = cfg.integer("KUBERNETES_WATCH_TIMEOUT_SECONDS", 300, minimum=1)
# Fixed: a call to the API server, and how often the watch process re-reads
# which deployments to watch.
KUBERNETES_REQUEST_TIMEOUT_SECONDS = 10.0
KUBERNETES_DEPLOYMENTS_REFRESH_SECONDS = 30.0
# The vLLM image a rendered KServe ServingRuntime runs unless the deployment names one.
KSERVE_VLLM_IMAGE = cfg.env.str("KSERVE_VLLM_IMAGE", default="vllm/vllm-openai:v0.33.0")
# The control plane's namespace (deploy/kustomize): a rendered runtime's replicas
# send their token counts to its web Service there, and its NetworkPolicy lets
# only the front door's pod (the door and the workers that drive the replicas) in.
KSERVE_CONTROL_PLANE_NAMESPACE = cfg.env.str(
    "KSERVE_CONTROL_PLANE_NAMESPACE", default="lora-registry"
)
CELERY_BEAT_SCHEDULE = {
    "serving-reconcile": {
        "task": "serving.reconcile_all",
        "schedule": SERVING_RECONCILE_INTERVAL_SECONDS,
        # A tick that cannot start before the next one is useless.
        "options": {"expires": SERVING_RECONCILE_INTERVAL_SECONDS},
    },
    "serving-sweep": {
        "task": "serving.sweep",
        "schedule": SERVING_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": SERVING_SWEEP_INTERVAL_SECONDS},
    },
    "serving-housekeeping": {"task": "serving.housekeeping", "schedule": 600.0},
    "observability-housekeeping": {"task": "observability.housekeeping", "schedule": 3600.0},
    "serving-door-access-tick": {
        "task": "serving.door_access_tick",
        "schedule": SERVING_ACCESS_TICK_SECONDS,
        "options": {"expires": SERVING_ACCESS_TICK_SECONDS},
    },
}
CELERY_BEAT_SCHEDULE.update(_MLFLOW_BEAT)
CELERY_BEAT_SCHEDULE["notifications-sweep"] = {
    "task": "notifications.sweep",
    "schedule": NOTIFICATIONS_SWEEP_SECONDS,
    "options": {"expires": NOTIFICATIONS_SWEEP_SECONDS},
}
# Keys and grants that end within 7 days are told once each.
CELERY_BEAT_SCHEDULE["notifications-expiring"] = {
    "task": "notifications.expiring",
    "schedule": 3600.0,
    "options": {"expires": 3600.0},
}
# Token budgets at 80 % and 100 %, and replicas out of sync past the bound.
for _name in ("budgets", "out_of_sync"):
    CELERY_BEAT_SCHEDULE[f"notifications-{_name}"] = {
        "task": f"notifications.{_name}",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    }
if OIDC_CHECK_INTERVAL_SECONDS:  # noqa: F821 - set by sso.conf, declared above
    # A quarter of the interval: each run checks only the identities that are due.
    CELERY_BEAT_SCHEDULE["sso-check-identities"] = {
        "task": "sso.check_identities",
        "schedule": max(60.0, OIDC_CHECK_INTERVAL_SECONDS / 4),  # noqa: F821
        "options": {"expires": max(60.0, OIDC_CHECK_INTERVAL_SECONDS / 4)},  # noqa: F821
    }

# --- Observability (observability/) -------------------------------------------
# GET /metrics needs `Authorization: Bearer <METRICS_TOKEN>`, unless anonymous
# scrapes are allowed (a network policy in front); with neither it answers 404.
METRICS_TOKEN = cfg.secret("METRICS_TOKEN") or ""
METRICS_ALLOW_ANONYMOUS = cfg.boolean("METRICS_ALLOW_ANONYMOUS", False)
# Each reconcile reads every up replica's /metrics (vllm:lora_requests_info).
OBSERVABILITY_VLLM_METRICS = cfg.boolean("OBSERVABILITY_VLLM_METRICS", True)
# Read the front door's per-adapter request counters at every reconcile (usage and cost).
OBSERVABILITY_FRONT_DOOR_USAGE = cfg.boolean("OBSERVABILITY_FRONT_DOOR_USAGE", True)
# Fixed: bounds on that read (whole exchange; body), far above what vLLM sends.
OBSERVABILITY_VLLM_METRICS_TIMEOUT_SECONDS = 3.0
OBSERVABILITY_VLLM_METRICS_MAX_BYTES = 2 * 1024**2
# An adapter served but not seen active for this long is suggested for retirement.
# Fixed: only a suggestion on the pages; nothing is retired by it.
OBSERVABILITY_IDLE_DAYS = 14.0
# Planner defaults where a deployment does not say (its GPU memory and share are its own).
PLANNER_GPU_MEMORY_UTILIZATION = cfg.number(
    "PLANNER_GPU_MEMORY_UTILIZATION", 0.9, minimum=0.05, maximum=1.0
)
PLANNER_CONTEXT_LENGTH = cfg.integer("PLANNER_CONTEXT_LENGTH", 4096, minimum=1)
# What the planner assumes where a person leaves the field as it is: the page shows
# these values in its inputs, and the plan uses exactly what the inputs show.
# Fixed: a starting value the person edits on the page.
PLANNER_USE_CASES = 10
PLANNER_PRICE_PER_GPU_HOUR = cfg.number("PLANNER_PRICE_PER_GPU_HOUR", 2.0, minimum=0.0)
# The currency of every price and cost the pages show (ISO 4217, e.g. EUR): the
# prices above are plain numbers, and a number without its unit is not a cost.
COST_CURRENCY = cfg.env.str("COST_CURRENCY", default="USD")
if not (len(COST_CURRENCY) == 3 and COST_CURRENCY.isascii() and COST_CURRENCY.isupper()):
    raise ImproperlyConfigured(
        f"COST_CURRENCY must be a three-letter ISO 4217 code such as USD or EUR, "
        f"got {COST_CURRENCY!r}"
    )
# Tokens, as vLLM counted them: each replica exports one OTLP span per request
# to POST /otlp/<deployment>/v1/traces (observability/metering.py), with the
# deployment's metering token (`manage.py metering_token <deployment>`).
# A batch of vLLM's exporter is at most 512 spans (about 0.5 MiB).
# Fixed: eight times the largest batch vLLM sends.
OBSERVABILITY_OTLP_MAX_BODY_BYTES = 4 * 1024**2
# Per-request records are kept this long (a resent batch is recognised by them,
# and the door's per-minute limits read them); days are kept for ever.
# Fixed: a month and a few days to resend in; the day rows carry the history.
OBSERVABILITY_METERED_REQUEST_DAYS = 35.0
# How a deployment's monthly cost is split: by each calling department's share of
# its tokens, a prompt token counting PROMPT and a completion token COMPLETION.
# A completion token costs a decode step of its own, while a prompt's tokens are
# read in one parallel prefill: price lists charge them 3-5x (docs/operators/usage.md).
SERVING_COST_PROMPT_TOKEN_WEIGHT = cfg.number("SERVING_COST_PROMPT_TOKEN_WEIGHT", 1.0, minimum=0.0)
SERVING_COST_COMPLETION_TOKEN_WEIGHT = cfg.number(
    "SERVING_COST_COMPLETION_TOKEN_WEIGHT", 3.0, minimum=0.0
)
if SERVING_COST_PROMPT_TOKEN_WEIGHT + SERVING_COST_COMPLETION_TOKEN_WEIGHT <= 0:
    raise ImproperlyConfigured(
        "SERVING_COST_PROMPT_TOKEN_WEIGHT and SERVING_COST_COMPLETION_TOKEN_WEIGHT "
        "may not both be 0: nothing would carry the cost"
    )
# --- end observability ----------------------------------------------------------

# --- REST API ---------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "core.api.authentication.BearerTokenAuthentication",
        "core.api.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.StandardPagination",
    "DEFAULT_FILTER_BACKENDS": [
        "core.api.filters.StrictFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "core.api.schema.ApiAutoSchema",
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "LoRA Adapter Registry API",
    "DESCRIPTION": (
        "Versioned LoRA adapters per department, four-eyes approval, and rollouts "
        "into vLLM. Pipelines authenticate with `Authorization: Bearer <token>`. "
        "[Back to the app](/)."
    ),
    # One group per resource (core.api.schema.ApiAutoSchema.get_tags), in this order.
    "TAGS": [
        {"name": "adapters", "description": "A department's adapters and their versions."},
        {"name": "versions", "description": "Adapter versions: upload, submit, review."},
        {
            "name": "promotions",
            "description": "Asking for a version to be served, and approving it.",
        },
        {"name": "rollouts", "description": "What the control plane did to serve a version."},
        {
            "name": "deployments",
            "description": "Where adapters are served: replicas, state, usage.",
        },
        {"name": "inference-keys", "description": "Keys clients send to the front door."},
        {"name": "grants", "description": "One department calling another's adapter."},
        {"name": "departments", "description": "Departments and their members."},
        {"name": "service-accounts", "description": "Accounts for pipelines, and their tokens."},
        {"name": "tokens", "description": "Your API tokens."},
        {
            "name": "artifact-sources",
            "description": "Where a department's artifacts may come from.",
        },
        {"name": "mlflow-experiments", "description": "MLflow experiments a department may use."},
        {"name": "mlflow", "description": "MLflow's webhook deliveries."},
        {"name": "usage", "description": "Requests and cost per department and adapter."},
        {"name": "planner", "description": "How many adapters fit on which GPU."},
        {"name": "audit-events", "description": "The hash-chained audit log."},
        {"name": "notifications", "description": "Your notifications: what needs you."},
        {
            "name": "notification-preferences",
            "description": "How each kind of event reaches you.",
        },
        {
            "name": "mail-outbox",
            "description": "The emails kept instead of sent (`make run`'s local mail outbox).",
        },
        {"name": "webhooks", "description": "A department's signed outbound webhooks."},
        {
            "name": "chat-channels",
            "description": "A department's chat channels (Slack or Teams incoming webhooks).",
        },
        {"name": "health", "description": "Liveness and readiness probes."},
    ],
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "core.api.schema.postprocess_forbid_nul",
    ],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    # The notifications app's choice sets, named once (each is used by several fields).
    "ENUM_NAME_OVERRIDES": {
        "EventKindEnum": "notifications.events.KIND_CHOICES",
        "NotificationChannelEnum": "notifications.models.Channel.choices",
    },
    # Vendored Swagger UI: no CDN at run time (air-gapped platforms).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Logging: structured enough to grep, never secrets -----------------------
LOG_LEVEL = cfg.choice("LOG_LEVEL", "INFO", {"DEBUG", "INFO", "WARNING", "ERROR"})
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "core.middleware.RequestIdLogFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"}
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
