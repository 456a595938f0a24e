from django.urls import path

from serving.web import caller_views, views
from serving.web.adapter_list import adapter_list

app_name = "serving"

urlpatterns = [
    path("adapters/", adapter_list, name="adapters"),
    path("deployments/", views.deployment_list, name="deployments"),
    path("deployments/<slug:name>/", views.deployment_detail, name="deployment"),
    path("deployments/<slug:name>/kserve.yaml", views.deployment_kserve, name="deployment-kserve"),
    path("versions/<int:pk>/promote/", views.promote, name="promote"),
    path("promotions/<int:pk>/review/", views.promotion_review_view, name="promotion-review"),
    path("rollouts/<int:pk>/", views.rollout_detail, name="rollout"),
    path("rollouts/<int:pk>/live/", views.rollout_live, name="rollout-live"),
    path("rollouts/<int:pk>/rollback/", views.rollout_rollback, name="rollout-rollback"),
    path("rollouts/<int:pk>/cancel/", views.rollout_cancel_view, name="rollout-cancel"),
    path("keys/", caller_views.my_keys, name="my-keys"),
    path("keys/<int:pk>/revoke/", caller_views.key_revoke_view, name="key-revoke"),
    path("keys/<int:pk>/limits/", caller_views.key_limits_view, name="key-limits"),
    path("departments/<slug:slug>/keys/", caller_views.department_keys, name="department-keys"),
    path("grants/<int:pk>/decide/", caller_views.grant_decide_view, name="grant-decide"),
    path(
        "rollouts/<int:pk>/canary/<slug:decision>/",
        views.rollout_canary_view,
        name="rollout-canary",
    ),
]
