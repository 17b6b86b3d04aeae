"""Hub handler giving a logged-in user their billing account (credit, time left, warnings),
for the credit banner on hub pages (hub_config/templates/page.html)."""

from __future__ import annotations

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import has_scope
from tornado import web

from gputap_common import scopes
from gputap_common.hours import format_hours

from ..core.form import course_offers
from ..lifecycle.billing_client import BillingClient, BillingRefused, BillingUnavailable

ACCOUNT_PATH = "gputap/account"


class AccountHandler(APIHandler):
    """GET /hub/gputap/account: billing's view of the caller's own account (JSON).

    Billing is asked with the hub's token, so the caller must hold the scope billing would
    ask of them. A course student's answer adds ``course_hours``: each course's hours left
    this week, as the spawn form writes them (course hours are not credit). Cookie requests
    need the page's XSRF token (``X-XSRFToken``), as every hub API call does; token requests
    do not.
    """

    async def get(self) -> None:
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "Log in to see your credit")
        if user.kind != "user":
            raise web.HTTPError(403, "Billing accounts belong to users, not services")
        if not has_scope(scopes.BILLING_ACCESS, self.parsed_scopes, db=self.db):
            raise web.HTTPError(403, f"Reading your credit needs the scope {scopes.BILLING_ACCESS}")
        # the default spawner only for its billing settings: never replace a failed one here
        # (its spawn page may still be reading why it failed)
        billing = user.spawner.billing
        try:
            account = await account_of(billing, user.name)
        except BillingUnavailable as e:
            raise web.HTTPError(
                503, f"Billing is unreachable, so your credit cannot be shown now ({e})"
            ) from None
        except BillingRefused as e:
            raise web.HTTPError(502, f"Billing refused to show your credit: {e.message}") from None
        if account.get("courses"):
            account["course_hours"] = await course_hours(billing, user.name)
        self.set_header("Cache-Control", "no-store")
        self.write(account)


async def account_of(billing: BillingClient, username: str) -> dict:
    """The user's account view; opened (with trial credit) if billing was down at login."""
    try:
        return await billing.account(username)
    except BillingRefused as e:
        if e.status != 404:
            raise
    return await billing.open_account(username)


async def course_hours(billing: BillingClient, username: str) -> list[dict[str, str]]:
    """Each of the user's courses with its hours left this week as text ("Intro to DL: 6 h
    of T4 left this week"); none when billing cannot say (the credit is still shown)."""
    try:
        offers = course_offers(await billing.courses(username))
    except (BillingUnavailable, BillingRefused):
        return []
    return [
        {
            "course": offer.slug,
            "name": offer.name,
            "text": f"{offer.name}: "
            + ", ".join(f"{format_hours(h)} of {sku}" for sku, h in offer.hours_left.items())
            + " left this week",
        }
        for offer in offers
    ]


default_handlers = [(rf"/{ACCOUNT_PATH}", AccountHandler)]
