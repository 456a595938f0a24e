from django.urls import path

from observability.api.views import PlannerView, UsageView

urlpatterns = [
    path("planner/", PlannerView.as_view(), name="planner"),
    path("usage/", UsageView.as_view(), name="usage"),
]
