"""Core's API routes, under /api/v1/ beside the apps' (config/urls.py)."""

from rest_framework.routers import SimpleRouter

from core.api import views

# SimpleRouter: the API root view (/api/v1/) is the registry's router's.
router = SimpleRouter()
router.register("departments", views.DepartmentViewSet, basename="department")
router.register("audit-events", views.AuditEventViewSet, basename="audit-event")
router.register("tokens", views.TokenViewSet, basename="token")

urlpatterns = router.urls
