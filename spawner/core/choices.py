"""What a user may choose now, pure: every offering of the inventory with its live numbers,
and which offering a request waits for when it is sold out."""

from __future__ import annotations

from .catalog import CPU_KEY, Catalog
from .form import Choice
from .placement import (
    CardRequest,
    FreeView,
    Refusal,
    Request,
    SharedRequest,
    SliceRequest,
    place,
    request_for,
)


def wanted_key(request: Request) -> str | None:
    """The offering a request waits for when sold out (specs and CPU never wait)."""
    if isinstance(request, CardRequest):
        return request.card
    if isinstance(request, SliceRequest | SharedRequest):
        return request.key
    return None


def units(request: Request) -> int:
    """How many units of its offering a request takes (whole cards may be several)."""
    return request.count if isinstance(request, CardRequest) else 1


def build_choices(view: FreeView, catalog: Catalog, prices: dict[str, int]) -> list[Choice]:
    """Every offering the inventory holds with its live numbers, cheapest first, then CPU;
    sold-out ones with the free alternatives a request for them would be offered."""
    result = []
    for key in view.keys():
        offering = catalog.offering(key)
        alternatives: tuple = ()
        if view.max_free(key) == 0 and key in prices:
            answer = place(request_for(offering), view, catalog, prices)
            alternatives = answer.alternatives if isinstance(answer, Refusal) else ()
        result.append(
            Choice(
                offering,
                view.free(key),
                view.total(key),
                view.max_capacity(key),
                prices.get(key),
                alternatives,
            )
        )
    result.sort(key=lambda c: (c.price_per_hour_micro or 0, c.offering.key))
    result.append(Choice(catalog.cpu, 1, 1, 1, prices.get(CPU_KEY)))
    return result
