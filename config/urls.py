from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core.api.errors import api_not_found
from registry.api.views import HealthView
from registry.web.forms import SignInForm

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("serving.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # Last of the API routes; a path without its trailing slash still gets
    # CommonMiddleware's redirect, since Django tries the slashed path first.
    re_path(r"^api/.*/$", api_not_found),
    path("healthz", HealthView.as_view(), name="health"),
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
    path("", include("serving.web.urls")),
    path("", include("registry.web.urls")),
]
