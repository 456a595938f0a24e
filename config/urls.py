from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from registry.api.views import HealthView
from sso import views as sso_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("serving.api.urls")),
    path("api/v1/", include("mlflow_bridge.api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", HealthView.as_view(), name="health"),
    path("api-auth/", include("rest_framework.urls")),
    # Local passwords (unless LOCAL_LOGIN=false) and single sign-on (OIDC).
    path("login/", sso_views.LoginView.as_view(), name="login"),
    path("logout/", sso_views.logout, name="logout"),
    path("oidc/", include("sso.urls")),
    path("", include("serving.web.urls")),
    path("", include("registry.web.urls")),
]
