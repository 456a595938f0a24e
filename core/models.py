"""Who is who, and what happened: departments and their members, pipeline
tokens, and the append-only audit log. Every app builds on these.

The tables keep their original names (registry_*): the models moved here from
the registry app with state-only migrations, so no data was copied.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Department(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    artifact_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Archived versions' artifacts are deleted from the store this many days "
        "after they were archived (audited). Empty keeps them forever.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "registry_department"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    APPROVER = "approver", "Approver"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    department = models.ForeignKey(Department, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "registry_membership"
        constraints = [
            models.UniqueConstraint(
                fields=["user", "department"], name="one_membership_per_department"
            )
        ]
        ordering = ["department__slug", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} ({self.role}) in {self.department}"


class Ability(models.TextChoices):
    """What a pipeline token may do. Approval is deliberately not an ability."""

    REGISTER_VERSIONS = "versions:register", "Register versions"
    SUBMIT_FOR_REVIEW = "versions:submit", "Submit versions for review"
    CREATE_ADAPTERS = "adapters:create", "Create adapters"
    PROMOTE = "deployments:promote", "Promote approved versions"
    ROLLBACK = "deployments:rollback", "Roll deployments back to a version they served before"
    RETIRE = "deployments:retire", "Retire adapters from deployments"
    # Who did what and who belongs: a pipeline that registers needs neither.
    READ_AUDIT = "audit:read", "Read the audit log and the membership lists"


class ServiceAccount(models.Model):
    """A pipeline that is not a person: its department owns it, so its tokens
    outlive whoever created it. It acts only through tokens and never approves.

    `user` is a login-less account row (no password, no membership, never
    staff) so that what it registers has an author like everything else."""

    department = models.ForeignKey(
        Department, on_delete=models.PROTECT, related_name="service_accounts"
    )
    name = models.SlugField(max_length=64)
    description = models.CharField(max_length=300, blank=True)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="service_account"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    deactivated_at = models.DateTimeField(null=True, blank=True)
    deactivated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["department__slug", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["department", "name"], name="one_service_account_name_per_department"
            )
        ]

    def __str__(self) -> str:
        return f"{self.department.slug}/{self.name}"

    @property
    def active(self) -> bool:
        return self.deactivated_at is None


class ApiToken(models.Model):
    department = models.ForeignKey(Department, on_delete=models.CASCADE, related_name="api_tokens")
    # Set for a service account's token: it acts as the account, not as created_by.
    service_account = models.ForeignKey(
        ServiceAccount, on_delete=models.PROTECT, null=True, blank=True, related_name="tokens"
    )
    name = models.CharField(max_length=100)
    # The first characters of the secret, kept to tell tokens apart in lists and logs.
    prefix = models.CharField(max_length=16, db_index=True)
    secret_sha256 = models.CharField(max_length=64, unique=True)
    abilities = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "registry_apitoken"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def acting_user(self):
        """Whom a request with this token acts as: its service account, or the person."""
        return self.service_account.user if self.service_account_id else self.created_by


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise PermissionError("Audit events are append-only.")

    def delete(self):
        raise PermissionError("Audit events are append-only.")


class AuditEvent(models.Model):
    """One security-relevant fact. Written in the same transaction as the change."""

    # Set by core.audit before the hash is computed (auto_now_add would change it after).
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    actor_token = models.ForeignKey(
        ApiToken, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=64, db_index=True)
    department = models.ForeignKey(
        Department, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=300)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    comment = models.TextField(blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    client_address = models.GenericIPAddressField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    # The tamper-evident chain (core.audit_chain): sha256 of this event's
    # fields and the previous event's hash.
    prev_hash = models.CharField(max_length=64, blank=True, editable=False)
    hash = models.CharField(max_length=64, blank=True, editable=False)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        db_table = "registry_auditevent"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"])]

    def __str__(self) -> str:
        return f"{self.action} {self.object_repr} by {self.actor_label}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise PermissionError("Audit events are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("Audit events are append-only.")
