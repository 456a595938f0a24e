import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

from config.celery_liveness import install as install_liveness
from config.celery_shutdown import install as install_shutdown_bound

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# sqlite:///path is the embedded broker (config/broker.py), registered before any
# connection is made.
TRANSPORT_ALIASES.setdefault("sqlite", "config.broker:Transport")
# kombu's Redis transport with the fix that lets a worker survive a Redis
# restart (config/celery_redis.py).
for _scheme in ("redis", "rediss"):
    TRANSPORT_ALIASES[_scheme] = "config.celery_redis:Transport"

app = Celery("adapter_registry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# With WORKER_LIVENESS_FILE set, the worker proves it still consumes
# (config/celery_liveness.py: the liveness probe and scripts/supervise.py read it).
install_liveness(app)

# A worker's SIGTERM ends it within a bound even when Celery's cold shutdown hangs
# (config/celery_shutdown.py).
install_shutdown_bound(app)
