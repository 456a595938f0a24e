# The registry and control plane image: web (gunicorn), the workers, beat and
# the Kubernetes replica watch share it. Runs as a numeric non-root user (so
# Kubernetes can verify runAsNonRoot) and with a read-only root filesystem:
# static files are collected at build time; only VAR_DIR and /tmp are written.
FROM python:3.11-slim
# REMAP_SIGTERM: a worker's SIGTERM is a bounded cold shutdown (CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 REMAP_SIGTERM=SIGQUIT \
    VAR_DIR=/var/lib/registry DJANGO_STATIC_ROOT=/app/staticfiles
WORKDIR /app
# The front door (serving/door/, docs/door.md) is Debian's HAProxy 2.6.
RUN apt-get update && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
# OpenShift runs an arbitrary UID in group 0: the group gets what the owner has.
RUN DJANGO_DEBUG=true python manage.py collectstatic --noinput \
 && useradd --system --uid 10001 --gid 0 registry \
 && mkdir -p "$VAR_DIR" && chown 10001:0 "$VAR_DIR" \
 && chgrp -R 0 /app "$VAR_DIR" && chmod -R g=u /app "$VAR_DIR"
USER 10001
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind=0.0.0.0:8000", "--workers=3", \
     "--timeout=600", "--worker-tmp-dir=/tmp", "--access-logfile=-"]
