"""/scim/v2/...: the names django-scim2 reverses (namespace `scim`)."""

from django.urls import re_path

from sso.scim import views

app_name = "scim"

urlpatterns = [
    re_path(r"^$", views.NotImplementedView.as_view(), name="root"),
    re_path(r"^\.search$", views.NotImplementedView.as_view(), name="search"),
    re_path(r"^Users/\.search$", views.UserSearchView.as_view(), name="users-search"),
    re_path(r"^Users(?:/(?P<uuid>[^/]+))?$", views.UsersView.as_view(), name="users"),
    re_path(r"^Groups/\.search$", views.GroupSearchView.as_view(), name="groups-search"),
    re_path(r"^Groups(?:/(?P<uuid>[^/]+))?$", views.GroupsView.as_view(), name="groups"),
    re_path(r"^Me$", views.NotImplementedView.as_view(), name="me"),
    re_path(
        r"^ServiceProviderConfig$",
        views.ServiceProviderConfigView.as_view(),
        name="service-provider-config",
    ),
    re_path(
        r"^ResourceTypes(?:/(?P<uuid>[^/]+))?$",
        views.ResourceTypesView.as_view(),
        name="resource-types",
    ),
    re_path(r"^Schemas(?:/(?P<uuid>[^/]+))?$", views.SchemasView.as_view(), name="schemas"),
    re_path(r"^Bulk$", views.NotImplementedView.as_view(), name="bulk"),
    # Anything else under /scim/v2/ is a SCIM 404, not the site's HTML page.
    re_path(r"^[\s\S]*$", views.UnknownView.as_view()),
]
