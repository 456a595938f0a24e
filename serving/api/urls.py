from rest_framework.routers import DefaultRouter

from serving.api import callers, views

router = DefaultRouter()
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("promotions", views.PromotionViewSet, basename="promotion")
router.register("rollouts", views.RolloutViewSet, basename="rollout")

urlpatterns = [*router.urls, *callers.urlpatterns]
