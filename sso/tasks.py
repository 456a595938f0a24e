from celery import shared_task


@shared_task(name="sso.check_identities", acks_late=True, ignore_result=True)
def check_identities() -> dict:
    """Beat, every OIDC_CHECK_INTERVAL_SECONDS / 4: checks the identities that are
    due (sso/checks.py); each is claimed first, so overlapping runs share the work."""
    from django.conf import settings

    from sso.checks import sso_check_due

    if not settings.SSO_ENABLED or not settings.OIDC_CHECK_INTERVAL_SECONDS:
        return {}
    return sso_check_due()
