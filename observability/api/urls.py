from django.urls import path

from observability.api.views import PlannerView

urlpatterns = [path("planner/", PlannerView.as_view(), name="planner")]
