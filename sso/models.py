from django.conf import settings
from django.db import models


class Identity(models.Model):
    """A person as the identity provider knows them: (issuer, sub) never changes,
    unlike an email address or a username, so sign-ins are matched on it."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    # What the provider said at the last sign-in, for the admin and the no-access page.
    groups = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)
    # The provider's refresh token (offline_access), encrypted with a key derived
    # from SECRET_KEY (sso/checks.py): the periodic check asks the provider with
    # it whether this person still exists there. Empty: nothing to check with.
    refresh_token_encrypted = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)
    # "active", "gone" (the provider refused the refresh token), "error: ..."
    check_result = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        verbose_name_plural = "identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_subject")
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.subject} at {self.issuer})"


class ScimToken(models.Model):
    """The identity provider's credential for SCIM provisioning. Its own table
    and prefix: the API accepts none of these, and SCIM accepts nothing else.
    Stored as a SHA-256 digest, like API tokens (256 random bits)."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    secret_sha256 = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ScimUser(models.Model):
    """A person the identity provider provisioned through SCIM. `scim_id` is the
    id SCIM clients see (random, not the row id: nothing to enumerate);
    `deleted_at` set means the provider DELETEd them: the account stays
    (users are never deleted, the audit log names them) but SCIM no longer
    shows it, and it cannot sign in."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scim_user"
    )
    scim_id = models.CharField(max_length=36, unique=True)
    external_id = models.CharField(max_length=255, blank=True, default="", db_index=True)
    # How the provider labelled the one email address kept (User.email).
    email_type = models.CharField(max_length=20, blank=True, default="")
    email_primary = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user} (SCIM {self.scim_id})"


class ScimGroup(models.Model):
    """A group as the identity provider pushes it. Its display name is looked up
    in OIDC_GROUP_MAP, exactly like a groups claim at sign-in: membership in a
    mapped group is what gives a department role or platform admin."""

    scim_id = models.CharField(max_length=36, unique=True)
    display_name = models.CharField(max_length=255, unique=True)
    external_id = models.CharField(max_length=255, blank=True, default="", db_index=True)
    members = models.ManyToManyField(ScimUser, related_name="groups", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["display_name"]

    def __str__(self) -> str:
        return self.display_name
