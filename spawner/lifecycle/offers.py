"""What a user is offered before a start: prices from billing, the spawn form, and the live
preview of where a request would go; for every backend, given what is free as arguments."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tornado import web

from ..core.asking import credit_of
from ..core.catalog import CPU_KEY, Catalog
from ..core.environment_form import Picker
from ..core.form import Choice, course_offers, preview_answer, render_form, with_alternatives
from ..core.placement import FreeView, Request, RequestError, place
from . import refusals
from .billing_client import BillingClient, BillingRefused, BillingUnavailable, unavailable_error


async def price_book(
    billing: BillingClient, view: FreeView, price_class: str = "on-demand"
) -> tuple[dict[str, int], int]:
    """Prices of everything ``view`` holds and billing's spot discount (percent); 503 when
    billing cannot be asked, 502 when it refuses."""
    try:
        return await billing.price_book(sorted(view.keys()) + [CPU_KEY], price_class)
    except BillingUnavailable as e:
        raise unavailable_error(e) from None
    except BillingRefused as e:
        raise web.HTTPError(
            502, f"Billing refused to give prices, so no server can start now: {e.message}"
        ) from None


async def options_form(
    billing: BillingClient,
    user: str,
    choices: Callable[[], Awaitable[tuple[list[Choice], bool, int]]],
    picker: Callable[[Sequence[str], dict[str, Any] | None], Picker | None],
    *,
    preview_url: str,
    offers_spot: bool,
    offer_similar_on_fault: bool,
    notice: str,
) -> str:
    """The spawn form of ``user``: their credit and courses, the ``choices`` free now, the
    environment ``picker`` and the refusal of their last start from the form, shown once."""
    try:
        account = await billing.open_account(user)
        courses = course_offers(await billing.courses(user))
        terms = await billing.price_list([CPU_KEY])
    except (BillingUnavailable, BillingRefused) as e:
        raise unavailable_error(e) from None
    offered, simulated, spot_discount = await choices()
    credit = credit_of(account, int(terms.get("min_billable_seconds") or 0))
    refused = refusals.take(user)
    return render_form(
        offered,
        credit=credit,
        simulated=simulated,
        preview_url=preview_url,
        spot_discount_percent=spot_discount if offers_spot else None,
        offer_similar_on_fault=offer_similar_on_fault,
        notice=notice,
        courses=courses,
        refused=refused and with_alternatives(refused, offered, credit),
        picker=picker([c.slug for c in courses], dict(refused.options) if refused else None),
    )


def preview(
    request: Request,
    catalog: Catalog,
    view: FreeView,
    simulated: bool,
    prices: dict[str, int],
) -> dict[str, Any]:
    """Which card ``request`` would get in ``view``, without taking anything."""
    try:
        answer = place(request, view, catalog, prices)
    except RequestError as e:
        return {"ok": False, "message": str(e)[:1].upper() + str(e)[1:] + "."}
    return preview_answer(answer, simulated)
