"""Prices: what each SKU costs now (any caller, the spawner's form), and the price book's
versions (listed to anyone, published by admins)."""

from __future__ import annotations

import logging
from typing import Any

from tornado import web

from gputap_common.bodies import shown
from gputap_common.money import format_credits

from ..domain.pricing import DISK, ON_DEMAND, PRICE_CLASSES, make_price_book
from .base import APIHandler
from .fields import SKU_NAME
from .views import price_book_view

log = logging.getLogger("billing")
#: the most SKUs one price book may price
MAX_PRICE_BOOK_SKUS = 1000


class PricesHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        version, book = await self.blocking(self.store.price_book_at)
        asked = self.get_arguments("sku")
        price_class = self.get_argument("price_class", ON_DEMAND)
        if price_class not in PRICE_CLASSES:
            raise web.HTTPError(
                400,
                "price_class must be 'on-demand', 'spot' or 'storage' (data disks, per "
                f"GB-hour), not {price_class!r}",
            )
        # storage prices only the disk (per GB-hour); on-demand and spot only servers
        prices, unpriced = book.lookup(asked or book.skus(price_class), price_class)
        result: dict[str, Any] = {
            "currency": self.currency,
            "min_billable_seconds": self.store.min_billable_seconds,
            "spot_discount_percent": book.spot_discount_percent,
            "price_class": price_class,
            "version": version,
            "prices": {
                sku: {"per_hour_micro": micro, "per_hour": format_credits(micro)}
                for sku, micro in prices.items()
            },
        }
        if asked:
            result["unpriced"] = unpriced
        self.write_json(result)


class PriceBooksHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        await self.write_records("price_books", price_book_view, self.store.price_books)

    @web.authenticated
    async def post(self) -> None:
        """Publish a new version; running sessions keep the price they started with."""
        self.require_admin()
        body = self.body(("prices", "spot_discount_percent", "shared_percent"))
        prices = body.get("prices")
        if not isinstance(prices, dict) or not prices:
            raise web.HTTPError(
                400,
                "Field 'prices' must be an object of SKU to credits per hour, "
                'e.g. {"A100-80GB": "8.00", "cpu": "0.10"}',
            )
        if len(prices) > MAX_PRICE_BOOK_SKUS:
            raise web.HTTPError(
                400, f"A price book holds at most {MAX_PRICE_BOOK_SKUS} SKUs, not {len(prices)}"
            )
        for sku in prices:
            if sku != DISK and not SKU_NAME.fullmatch(sku):
                raise web.HTTPError(
                    400,
                    f"SKU {shown(sku)} is no SKU name: a card or cpu (1 to 64 of A-Z, a-z, "
                    "0-9, '.' and '-', starting with a letter or digit), CARD/<g>g.<m>gb, "
                    "CARD/shared or disk",
                )
        current = (await self.blocking(self.store.price_book_at))[1]
        try:
            book = make_price_book(
                prices,
                body.get("spot_discount_percent", current.spot_discount_percent),
                body.get("shared_percent", current.shared_percent),
            )
        except ValueError as e:
            raise web.HTTPError(400, str(e).replace("billing.", "")) from None
        # every SKU the platform sells keeps a price: those of the settings' book, where the
        # operator prices the catalog and inventory they run (docs/billing.md)
        sold = self.store.settings_price_book.skus()
        unpriced = sorted(sku for sku in sold if book.price(sku) is None)
        if unpriced:
            raise web.HTTPError(
                409,
                f"This price book leaves {', '.join(unpriced)} without a price, and the platform "
                "sells them: price every SKU of GET api/prices. To stop selling one, remove it "
                "from billing.prices in the settings and restart billing.",
            )
        record, created = await self.blocking(
            self.store.publish_price_book, book, self.caller, "admin", self.now()
        )
        if created:
            log.info("Price book version %s published by %s", record.version, self.caller)
        self.write_saved(price_book_view(record), created)


default_handlers = [
    (r"api/prices", PricesHandler),
    (r"api/price-books", PriceBooksHandler),
]
