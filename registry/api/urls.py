from rest_framework.routers import DefaultRouter

from registry.api import views

router = DefaultRouter()
router.register("departments", views.DepartmentViewSet, basename="department")
router.register("adapters", views.AdapterViewSet, basename="adapter")
router.register("versions", views.VersionViewSet, basename="version")
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")
router.register("tokens", views.TokenViewSet, basename="token")

urlpatterns = router.urls
