from django.urls import path

from registry.web import views

app_name = "web"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("activity/", views.activity, name="activity"),
    path("adapters/new/", views.adapter_new, name="adapter-new"),
    path("adapters/<int:pk>/", views.adapter_detail, name="adapter"),
    path("adapters/<int:pk>/versions/", views.version_upload, name="version-upload"),
    path("versions/<int:pk>/", views.version_detail, name="version"),
    path("versions/<int:pk>/actions/", views.version_action, name="version-action"),
    path("reviews/", views.review_queue, name="reviews"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke_view, name="token-revoke"),
]
