"""The view a user would write: save an order and enqueue its crawl in one transaction."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from celery_ha.contrib.django import enqueue_on_commit
from djproj.shop.models import Order


def create_order(request: HttpRequest) -> JsonResponse:
    try:
        with transaction.atomic():
            order = Order.objects.create(url=request.POST["url"])
            task_id = enqueue_on_commit(order.url, task="crawl_list", meta={"order": order.pk})
    except ValueError as exc:  # InvalidInput: a 400, and the order was rolled back with it
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"order": order.pk, "task": task_id})
