from django.urls import path

from sso import views

# Names without a namespace: mozilla-django-oidc reverses these exact names.
urlpatterns = [
    path(
        "authenticate/", views.AuthenticationRequestView.as_view(), name="oidc_authentication_init"
    ),
    path("callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
    path("logout/", views.logout, name="oidc_logout"),
    path("no-access/", views.no_access, name="sso-no-access"),
]
