from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core.api.errors import api_not_found
from core.health import LivenessView, ReadinessView
from observability.urls import metrics_urlpatterns
from serving.api.doors import door_urlpatterns
from sso import views as sso_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("core.api.urls")),
    path("api/v1/", include("serving.api.urls")),
    path("api/v1/", include("mlflow_bridge.api")),
    path("api/v1/", include("observability.api.urls")),
    path("api/v1/", include("core.api.service_accounts")),
    path("api/v1/", include("notifications.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # Last of the API routes; a path without its trailing slash still gets
    # CommonMiddleware's redirect, since Django tries the slashed path first.
    # [\s\S], not ".": a path with a newline in it is an API path too.
    re_path(r"^api/[\s\S]*/$", api_not_found),
    path("livez", LivenessView.as_view(), name="livez"),
    path("readyz", ReadinessView.as_view(), name="readyz"),
    *metrics_urlpatterns,
    *door_urlpatterns,
    path("api-auth/", include("rest_framework.urls")),
    # Local passwords (unless LOCAL_LOGIN=false) and single sign-on (OIDC).
    path("login/", sso_views.LoginView.as_view(), name="login"),
    path("logout/", sso_views.logout, name="logout"),
    path("oidc/", include("sso.urls")),
    # SCIM 2.0 provisioning (RFC 7644), for the identity provider only.
    path("scim/v2/", include("sso.scim.urls", namespace="scim")),
    path("", include("observability.urls")),
    path("", include("notifications.web.urls")),
    path("", include("serving.web.urls")),
    path("", include("registry.web.urls")),
]
