"""Signals every app may answer.

health_check: receivers return (name, {"ok": bool, ...}); the health endpoint
shows each one. An entry with "optional": true never makes the service unhealthy.
"""

from django.dispatch import Signal

health_check = Signal()
