from django.urls import path

from observability import views
from observability.web import views as web

app_name = "observability"

urlpatterns = [
    path("planner/", web.planner_page, name="planner"),
    path("usage/", web.usage_page, name="usage"),
    path("deployments/<slug:name>/plan/", web.deployment_plan_page, name="deployment-plan"),
]

metrics_urlpatterns = [path("metrics", views.metrics, name="metrics")]
