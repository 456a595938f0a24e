from rest_framework.routers import DefaultRouter

from registry.api import views

router = DefaultRouter()
router.register("adapters", views.AdapterViewSet, basename="adapter")
router.register("versions", views.VersionViewSet, basename="version")
router.register("artifact-sources", views.ArtifactSourceViewSet, basename="artifact-source")

urlpatterns = router.urls
