# A stand-in for python:3.11-slim, for machines that cannot pull it (made by
# scripts/compose/standin-base.sh, docs/operators/deployment.md): Debian
# bookworm's python3 (3.11, what python:3.11-slim-bookworm carries) in a venv
# whose python and pip come first on PATH, as the public image's do. Never pushed.
ARG BASE_IMAGE=localhost/debian-bookworm-minbase-standin
FROM ${BASE_IMAGE}
ENV LANG=C.UTF-8 PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/python
