"""The notifications app's API routes, under /api/v1/ (config/urls.py)."""

from rest_framework.routers import SimpleRouter

from notifications.api import views

router = SimpleRouter()
router.register("notifications", views.NotificationViewSet, basename="notification")
router.register(
    "notification-preferences", views.PreferenceViewSet, basename="notification-preference"
)
router.register("mail-outbox", views.MailOutboxViewSet, basename="mail-outbox")
router.register("webhooks", views.WebhookViewSet, basename="webhook")
router.register("chat-channels", views.ChatChannelViewSet, basename="chat-channel")

urlpatterns = router.urls
