import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# sqlite:///path is the embedded broker (config/broker.py), registered before any
# connection is made.
TRANSPORT_ALIASES.setdefault("sqlite", "config.broker:Transport")

app = Celery("adapter_registry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
