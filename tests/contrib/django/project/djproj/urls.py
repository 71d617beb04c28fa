from django.contrib import admin
from django.urls import include, path

from djproj.shop import views

urlpatterns = [
    path("admin/celery-ha/", include("celery_ha.contrib.django.urls")),
    path("admin/", admin.site.urls),
    path("orders/", views.create_order),
]
