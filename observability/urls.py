from django.urls import path

from observability import otlp, views
from observability.web import views as web

app_name = "observability"

urlpatterns = [
    path("planner/", web.planner_page, name="planner"),
    path("usage/", web.usage_page, name="usage"),
    path("deployments/<slug:name>/plan/", web.deployment_plan_page, name="deployment-plan"),
]

metrics_urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    # vLLM's OTLP/HTTP exporter posts its spans here (observability/otlp.py).
    path("otlp/<slug:name>/v1/traces", otlp.otlp_traces, name="otlp-traces"),
]
