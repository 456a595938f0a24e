from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from observability.urls import metrics_urlpatterns
from registry.api.views import HealthView
from registry.web.forms import SignInForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("serving.api.urls")),
    path("api/v1/", include("observability.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("healthz", HealthView.as_view(), name="health"),
    *metrics_urlpatterns,
    path("api-auth/", include("rest_framework.urls")),
    path(
        "login/",
        auth_views.LoginView.as_view(
            authentication_form=SignInForm, redirect_authenticated_user=True
        ),
        name="login",
    ),
    # LogoutView accepts POST only: a link or an <img> cannot sign anyone out.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("observability.urls")),
    path("", include("serving.web.urls")),
    path("", include("registry.web.urls")),
]
