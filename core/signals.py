"""Signals every app may answer.

health_check: receivers return (name, {"ok": bool, ...}); the health endpoint
shows each one. An entry with "optional": true never makes the service unhealthy;
its "notice", a public sentence, is shown as it is.

The others say that who a caller is has changed. They are sent inside the
transaction of the change; receivers record rows in it or enqueue work with
transaction.on_commit (serving ends inference keys with them).
"""

from django.dispatch import Signal

health_check = Signal()

# actor=<Actor or None>, user=<User>, reason=<str>: a person's access ended
# (deactivated: SCIM, the periodic check, the admin, offboarding).
user_access_ended = Signal()

# actor=<Actor or None>, user=<User>, department=<Department>: a person joined or
# left a department, or their role in it changed.
membership_changed = Signal()

# actor=<Actor>, account=<ServiceAccount>: a service account was deactivated.
service_account_deactivated = Signal()

# head_event_id=<int>: `audit_verify --expect-head <head> --restored` verified the
# chain of a restored database up to the event whose hash was shipped before the
# backup. Receivers distrust rows the chain does not vouch for (serving holds
# every deployment: serving/services/restore.py); they return a list of lines
# for the operator.
audit_chain_restored = Signal()

# event=<AuditEvent, not yet saved>: an audit event is being recorded, inside
# the transaction of the change it records (before the audit chain's lock).
# Receivers record rows in it (the notifications app writes its outbox row
# here, so an event is told exactly when its change commits) and never call
# out; a receiver's error rolls the change back.
audit_recorded = Signal()
