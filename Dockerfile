# The registry and control plane image: web (gunicorn), the workers, beat and
# the Kubernetes replica watch share it. Runs as a numeric non-root user (so
# Kubernetes can verify runAsNonRoot) and with a read-only root filesystem:
# static files are collected at build time; only VAR_DIR and /tmp are written.
# The public base by default. python:3.11-slim-bookworm, not python:3.11-slim:
# the bookworm tag keeps Debian 12, whose HAProxy 2.6 the door was tested on.
# A machine that cannot pull passes a stand-in built from Debian's packages
# (scripts/compose/standin-base.sh, docs/operators/deployment.md).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
# The HAProxy the front door's tests run (Debian bookworm's, tests/serving/door):
# a glob on the upstream version, so a Debian security revision still installs
# while another minor version fails the build.
ARG HAPROXY_VERSION=2.6.*
# REMAP_SIGTERM: a worker's SIGTERM is a bounded cold shutdown (CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT).
# HOME=/tmp: the root is read-only, and what writes under ~ (gunicorn's control
# socket, caches) gets the tmpfs.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 REMAP_SIGTERM=SIGQUIT \
    VAR_DIR=/var/lib/registry DJANGO_STATIC_ROOT=/app/staticfiles HOME=/tmp
WORKDIR /app
# The front door (serving/door/, docs/door.md) is Debian's HAProxy 2.6.
RUN apt-get update && apt-get install -y --no-install-recommends "haproxy=${HAPROXY_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && haproxy -v | head -1
COPY requirements.txt deploy/docker/constraints.txt ./
# The exact versions the suite ran with (deploy/docker/constraints.txt).
RUN pip install --no-cache-dir -r requirements.txt -c constraints.txt
COPY . .
# OpenShift runs an arbitrary UID in group 0: the group gets what the owner has.
# collectstatic under a throwaway VAR_DIR: settings create folders there, and a
# root-owned one shipped in VAR_DIR stays root's where podman copies the image's
# content into the tmpfs mounted over it (uploads failed: Permission denied).
RUN DJANGO_DEBUG=true VAR_DIR=/tmp/build-var python manage.py collectstatic --noinput \
 && rm -rf /tmp/build-var \
 && useradd --system --uid 10001 --gid 0 registry \
 && mkdir -p "$VAR_DIR" && chown 10001:0 "$VAR_DIR" \
 && chgrp -R 0 /app "$VAR_DIR" && chmod -R g=u /app "$VAR_DIR"
USER 10001
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind=0.0.0.0:8000", "--workers=3", \
     "--timeout=600", "--worker-tmp-dir=/tmp", "--access-logfile=-"]
