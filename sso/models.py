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

    class Meta:
        verbose_name_plural = "identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_subject")
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.subject} at {self.issuer})"
