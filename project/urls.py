from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    # The example project has no site of its own: its root (the admin's "View site") is the admin.
    path("", RedirectView.as_view(pattern_name="admin:index")),
]
