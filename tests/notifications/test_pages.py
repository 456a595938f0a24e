"""The notification pages: the inbox with its badge, opening one, the choices,
and a department's webhooks for its approvers only."""

from __future__ import annotations

import pytest

from core.actors import Actor
from notifications.models import Delivery, Notification, Preference, Webhook
from notifications.services.webhooks import webhook_create
from tests.factories import make_adapter, make_approved_version
from tests.notifications.conftest import fan_out_all
from tests.support.adapters import AdapterSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(lena, alex, legal):
    adapter = make_adapter(lena, legal, name="contracts", served_name="legal-contracts")
    version = make_approved_version(lena, alex, adapter, AdapterSpec(seed=81))
    fan_out_all()
    return version


def test_the_inbox_lists_them_and_the_badge_counts_the_unread(web_lena, approved):
    page = web_lena.get("/notifications/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "contracts version 1 was approved" in html
    assert 'data-testid="unread-badge"' in html
    assert 'aria-label="1 unread"' in html


def test_an_approver_finds_the_webhooks_of_their_departments_from_the_inbox(web_alex, web_lena):
    assert 'href="/departments/legal/webhooks/"' in web_alex.get("/notifications/").content.decode()
    assert "/webhooks/" not in web_lena.get("/notifications/").content.decode()


def test_opening_one_marks_it_read_and_goes_to_its_page(web_lena, lena, approved):
    notification = Notification.objects.get(user=lena)
    response = web_lena.post(f"/notifications/{notification.pk}/open/")
    assert response.status_code == 302
    assert response["Location"] == f"/versions/{approved.pk}/"
    notification.refresh_from_db()
    assert notification.read_at is not None
    assert 'data-testid="unread-badge"' not in web_lena.get("/notifications/").content.decode()


def test_another_persons_notification_is_a_404(web_fred, lena, approved):
    notification = Notification.objects.get(user=lena)
    assert web_fred.post(f"/notifications/{notification.pk}/open/").status_code == 404


def test_read_all_clears_the_badge(web_lena, approved):
    assert web_lena.post("/notifications/read-all/").status_code == 302
    assert 'data-testid="unread-badge"' not in web_lena.get("/notifications/").content.decode()


def test_the_choices_page_keeps_what_was_chosen(web_lena, lena):
    page = web_lena.get("/notifications/preferences/")
    assert page.status_code == 200
    assert "A version was approved" in page.content.decode()
    response = web_lena.post(
        "/notifications/preferences/",
        {"kind-version.approved": "off", "kind-rollout.failed": "in_app"},
    )
    assert response.status_code == 302
    chosen = dict(Preference.objects.filter(user=lena).values_list("kind", "channel"))
    assert chosen == {"version.approved": "off", "rollout.failed": "in_app"}


def test_an_approver_adds_a_webhook_and_sees_its_secret_once(web_alex, legal):
    response = web_alex.post(
        "/departments/legal/webhooks/", {"url": "https://93.184.215.14/hooks", "kinds": []}
    )
    assert response.status_code == 201
    webhook = Webhook.objects.get()
    assert webhook.secret in response.content.decode()
    assert response["Cache-Control"] == "no-store"
    assert webhook.secret not in web_alex.get("/departments/legal/webhooks/").content.decode()


def test_an_internal_url_is_refused_on_the_form(web_alex, legal):
    response = web_alex.post("/departments/legal/webhooks/", {"url": "http://127.0.0.1:8000/"})
    assert response.status_code == 403
    assert "internal address" in response.content.decode()
    assert not Webhook.objects.exists()


def test_a_member_may_not_manage_webhooks_and_an_outsider_is_not_told(web_lena, web_fred, legal):
    assert web_lena.get("/departments/legal/webhooks/").status_code == 403
    assert web_fred.get("/departments/legal/webhooks/").status_code == 404


def test_the_delivery_log_shows_each_delivery_and_redelivers(web_alex, root, legal, approved):
    webhook, _ = webhook_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/", allow_internal=True
    )
    from notifications.models import Event
    from notifications.services.outbox import event_fan_out

    # The approval's event came before the webhook; a new event reaches it.
    event = Event.objects.get(kind="version.approved")
    Event.objects.filter(pk=event.pk).update(fanned_out_at=None)
    event_fan_out(event.pk, "worker-a")
    delivery = Delivery.objects.get(webhook=webhook)
    page = web_alex.get(f"/webhooks/{webhook.pk}/")
    assert page.status_code == 200
    assert str(event.uid) in page.content.decode()
    response = web_alex.post(f"/webhooks/{webhook.pk}/deliveries/{delivery.pk}/redeliver/")
    assert response.status_code == 302


def test_a_member_is_not_shown_a_webhooks_log(web_lena, root, legal):
    webhook, _ = webhook_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/", allow_internal=True
    )
    assert web_lena.get(f"/webhooks/{webhook.pk}/").status_code == 404


def test_the_admin_shows_a_webhook_without_its_secret(as_root, root, legal):
    webhook, secret = webhook_create(
        actor=Actor(user=root), department=legal, url="http://127.0.0.1:9/", allow_internal=True
    )
    page = as_root.get(f"/admin/notifications/webhook/{webhook.pk}/change/")
    assert page.status_code == 200
    assert secret not in page.content.decode()
    assert b'name="_save"' not in page.content
