from django.urls import path

from notifications.web import views

app_name = "notifications"

urlpatterns = [
    path("notifications/", views.inbox, name="inbox"),
    path("notifications/<int:pk>/open/", views.open_notification, name="open"),
    path("notifications/read-all/", views.read_all, name="read-all"),
    path("notifications/preferences/", views.preferences, name="preferences"),
    path("notifications/outbox/", views.outbox, name="outbox"),
    path("departments/<slug:slug>/webhooks/", views.webhooks, name="webhooks"),
    path("departments/<slug:slug>/chat-channels/", views.chat_channels, name="chat-channels"),
    path("webhooks/<int:pk>/", views.webhook_detail, name="webhook"),
    path(
        "webhooks/<int:pk>/deliveries/<int:delivery>/redeliver/",
        views.redeliver,
        name="redeliver",
    ),
]
