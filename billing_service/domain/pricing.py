"""The price book: credits per hour for every SKU, from the ``billing.prices`` settings.

A SKU is a card ("A100-80GB"), CPU only ("cpu"), or a MIG slice "CARD/PROFILE"
("A100-80GB/1g.10gb"). A slice without an explicit price costs the card's price times
its share of the card's compute, g/7 for a "<g>g.<m>gb" profile, rounded half up.

Data disks are the one storage SKU, "disk": credits per GB-hour (a session's count is the
disk's size in GB), in the price class "storage" and no other; ``billing.prices.disk`` sets
it, else ``DEFAULT_DISK_PRICE_MICRO``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gputap_common.money import format_credits

from .errors import UnknownSku
from .money import MAX_PRICE_MICRO, parse_credits

MIG_PROFILE = re.compile(r"([1-7])g\.(\d+)gb")
SHARED = "shared"
MIG_SLICES_PER_CARD = 7

#: the storage SKU: a data disk, priced per GB-hour, metered from creation to deletion
DISK = "disk"
#: the price class of storage sessions; servers are ON_DEMAND or SPOT
STORAGE = "storage"
#: the price class of servers that are never interrupted, the default of every request
ON_DEMAND = "on-demand"
#: the price class of interruptible servers, at a discount (``spot_discount_percent``)
SPOT = "spot"
#: the price classes of servers (pods, processes): interruptible or not
SERVER_PRICE_CLASSES = (ON_DEMAND, SPOT)
PRICE_CLASSES = (*SERVER_PRICE_CLASSES, STORAGE)
#: a disk's price when ``billing.prices`` names none: 0.0002 credits per GB-hour
#: (a 100 GB disk costs 0.02 an hour, 14.40 over 30 days)
DEFAULT_DISK_PRICE_MICRO = 200


def check_price_class(sku: str, price_class: str) -> None:
    """``ValueError`` saying what to send when ``price_class`` is unknown or does not fit
    ``sku``: "storage" is for data disks ("disk") only, and a disk is only priced as storage."""
    if price_class not in PRICE_CLASSES:
        raise ValueError(
            f"price_class must be 'on-demand', 'spot' or 'storage', not {price_class!r}"
        )
    if price_class == STORAGE and sku != DISK:
        raise ValueError(
            f"price_class 'storage' is for data disks only (sku 'disk', count = size in GB), "
            f"not for {sku!r}: servers are 'on-demand' or 'spot'"
        )
    if sku == DISK and price_class != STORAGE:
        raise ValueError(
            f"sku 'disk' is a data disk, priced per GB-hour: send price_class 'storage', "
            f"not {price_class!r}"
        )


def check_storage_session(server_name: str, hold_id: str | None, course: str) -> None:
    """``ValueError`` naming the field when a storage session's request does not fit one."""
    if not server_name.startswith("disk:") or server_name == "disk:":
        raise ValueError(
            f"server_name: a data disk's storage session is named 'disk:NAME', not {server_name!r}"
        )
    if hold_id:
        raise ValueError("hold_id: data disks take no admission, so no hold")
    if course:
        raise ValueError(
            "course: a course's hours never pay for data disks; they are paid from the "
            "user's own credit (trial, then paid)"
        )


@dataclass(frozen=True)
class PriceBook:
    """Prices in micro-credits per hour. ``cards`` includes "cpu"; ``slices`` is explicit;
    ``storage`` is per GB-hour ("disk")."""

    cards: Mapping[str, int] = field(default_factory=dict)
    slices: Mapping[str, int] = field(default_factory=dict)
    storage: Mapping[str, int] = field(default_factory=lambda: {DISK: DEFAULT_DISK_PRICE_MICRO})
    spot_discount_percent: int = 60
    #: a time-sliced share of a GPU ("CARD/shared") costs this share of the card's price
    shared_percent: int = 25

    def price(self, sku: str, price_class: str = ON_DEMAND) -> int | None:
        """Micro-credits per hour for one unit of ``sku``; None when it has no price.

        Spot (interruptible) costs the on-demand price less ``spot_discount_percent``,
        rounded half up to the micro-credit. Storage ("disk") has a price in the class
        "storage" only, and nothing else has one there."""
        if price_class == STORAGE or sku == DISK:
            return self.storage.get(sku) if price_class == STORAGE else None
        on_demand = self._on_demand(sku)
        if on_demand is None or price_class == ON_DEMAND:
            return on_demand
        keep = 100 - self.spot_discount_percent
        return (2 * on_demand * keep + 100) // 200

    def _on_demand(self, sku: str) -> int | None:
        if sku in self.cards:
            return self.cards[sku]
        if sku in self.slices:
            return self.slices[sku]
        card, sep, profile = sku.partition("/")
        if not sep or card not in self.cards or card == "cpu":
            return None
        if profile == SHARED:
            # half up: floor(card * percent / 100 + 1/2)
            return (2 * self.cards[card] * self.shared_percent + 100) // 200
        match = MIG_PROFILE.fullmatch(profile)
        if not match:
            return None
        g = int(match.group(1))
        # half up: floor(card * g / 7 + 1/2)
        return (2 * self.cards[card] * g + MIG_SLICES_PER_CARD) // (2 * MIG_SLICES_PER_CARD)

    def require(self, sku: str, price_class: str = ON_DEMAND) -> int:
        """:meth:`price`, or ``UnknownSku`` saying what to ask for instead."""
        price = self.price(sku, price_class)
        if price is None:
            raise UnknownSku(
                f"No price for SKU {sku!r}; use a card, 'cpu', or CARD/<g>g.<m>gb "
                "listed by GET api/prices"
            )
        return price

    def configured(self) -> dict[str, int]:
        """Every SKU with a price of its own (cards, cpu, explicit slices, disk): the book
        as stored and shown."""
        return {**self.cards, **self.slices, **self.storage}

    def configured_credits(self) -> dict[str, str]:
        """:meth:`configured` as exact credits ("8.00"), by SKU: as stored and shown."""
        return {sku: format_credits(micro) for sku, micro in sorted(self.configured().items())}

    def skus(self, price_class: str = ON_DEMAND) -> list[str]:
        """The SKUs the book prices in ``price_class``: servers (cards, cpu, explicit slices)
        for on-demand and spot, data disks for storage."""
        if price_class == STORAGE:
            return list(self.storage)
        return [*self.cards, *self.slices]

    def lookup(
        self, skus: Iterable[str], price_class: str = ON_DEMAND
    ) -> tuple[dict[str, int], list[str]]:
        """Prices of ``skus`` and the list of those without a price, in the order asked."""
        priced: dict[str, int] = {}
        unpriced: list[str] = []
        for sku in skus:
            price = self.price(sku, price_class)
            if price is None:
                if sku not in unpriced:
                    unpriced.append(sku)
            else:
                priced[sku] = price
        return priced, unpriced


def make_price_book(
    prices: Mapping[str, object], spot_discount_percent: int = 60, shared_percent: int = 25
) -> PriceBook:
    """Build the price book from ``billing.prices``; ``ValueError`` names a bad key.

    ``disk`` is credits per GB-hour; without it disks cost ``DEFAULT_DISK_PRICE_MICRO``, and
    the book records that price, so a stored version always says what disks cost."""
    if not isinstance(prices, Mapping):
        raise ValueError("billing.prices must be a mapping of SKU to credits per hour")
    cards: dict[str, int] = {}
    slices: dict[str, int] = {}
    storage = {DISK: DEFAULT_DISK_PRICE_MICRO}
    for sku, value in prices.items():
        micro = parse_credits(value, f"billing.prices[{sku!r}]")
        if micro < 0:
            raise ValueError(f"billing.prices[{sku!r}] must not be negative")
        if micro > MAX_PRICE_MICRO:
            raise ValueError(
                f"billing.prices[{sku!r}] must be at most {format_credits(MAX_PRICE_MICRO)} "
                f"credits per hour, not {value!r}"
            )
        if sku == DISK:
            storage[DISK] = micro
        elif "/" in str(sku):
            card, _, profile = str(sku).partition("/")
            if card == DISK:
                raise ValueError(
                    f"billing.prices[{sku!r}]: a disk is priced per GB-hour as 'disk', "
                    "it has no slices"
                )
            if not card or not (MIG_PROFILE.fullmatch(profile) or profile == SHARED):
                raise ValueError(
                    f"billing.prices[{sku!r}]: a slice price needs CARD/<g>g.<m>gb or "
                    "CARD/shared, e.g. A100-80GB/1g.10gb"
                )
            slices[str(sku)] = micro
        else:
            cards[str(sku)] = micro
    for key, value, low in (
        ("spot_discount_percent", spot_discount_percent, 0),
        ("shared_percent", shared_percent, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 100:
            raise ValueError(
                f"billing.{key} must be a whole number from {low} to 99, not {value!r}"
            )
    return PriceBook(
        cards=cards,
        slices=slices,
        storage=storage,
        spot_discount_percent=spot_discount_percent,
        shared_percent=shared_percent,
    )
