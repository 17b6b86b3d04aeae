"""Placement: a request plus what is free plus prices gives a Placement or a Refusal.

Pure and synchronous: no I/O, no hub. The backends (local processes, Kubernetes) feed it a
:class:`FreeView` of their inventory and turn the answer into devices or a pod.

Requests (the ``user_options`` a user sends, validated by :func:`parse_request`):

- ``{"kind": "card", "card": "A100-80GB", "count": 2}``: whole cards on one machine;
- ``{"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}``: one MIG slice
  (``profile`` is accepted for ``mig_profile``: gputap's older name, which KubeSpawner
  reserves for its own profiles, so :func:`canonical_options` renames it);
- ``{"kind": "spec", "min_memory_gb": 32, "min_tflops": 80, "count": 1}``: the cheapest free
  card (or, for one GPU, slice) with at least that memory and FP16 TFLOPS per GPU;
- ``{"kind": "shared", "card": "T4"}``: a time-sliced share of a GPU (Kubernetes,
  ``nvidia.com/gpu.shared``); never matched by a spec;
- ``{"kind": "cpu"}``: no GPU. An empty request means CPU only.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gputap_common.bodies import shown
from gputap_common.money import format_credits

from .catalog import CPU_KEY, SHARED, Catalog, Offering, offering_key

#: Sanity bounds for spec requests: beyond these nothing could ever match.
MAX_SPEC_MEMORY_GB = 10_000
MAX_SPEC_TFLOPS = 100_000
MAX_COUNT = 64
#: a count sent as text: ASCII digits only, at most this many ("²" and "٣" are digits to
#: str.isdigit but not to int(); a very long one is refused by int() too)
MAX_COUNT_DIGITS = 4


class RequestError(ValueError):
    """A request that can never be served as written (HTTP 400); the message says why."""


@dataclass(frozen=True)
class CardRequest:
    card: str
    count: int = 1


@dataclass(frozen=True)
class SliceRequest:
    card: str
    profile: str

    @property
    def key(self) -> str:
        return offering_key(self.card, self.profile)


@dataclass(frozen=True)
class SharedRequest:
    card: str

    @property
    def key(self) -> str:
        return offering_key(self.card, SHARED)


@dataclass(frozen=True)
class SpecRequest:
    min_memory_gb: float = 0
    min_tflops: float = 0
    count: int = 1


@dataclass(frozen=True)
class CpuRequest:
    pass


Request = CardRequest | SliceRequest | SharedRequest | SpecRequest | CpuRequest


@dataclass(frozen=True)
class Placement:
    """Where a request goes: ``count`` units of ``offering`` on ``node`` at a price per unit."""

    offering: Offering
    count: int
    node: str
    price_per_hour_micro: int

    @property
    def total_per_hour_micro(self) -> int:
        return self.price_per_hour_micro * self.count


@dataclass(frozen=True)
class Alternative:
    """Something free now that the user could take instead."""

    offering: Offering
    free: int
    price_per_hour_micro: int


@dataclass(frozen=True)
class Refusal:
    """Nothing that fits is free now. ``reason`` says what was asked and what is free."""

    reason: str
    alternatives: tuple[Alternative, ...] = ()

    @property
    def message(self) -> str:
        if not self.alternatives:
            return f"{self.reason}. Nothing else is free right now; try again later."
        listed = "; ".join(
            f"{a.offering.label} at {format_credits(a.price_per_hour_micro)}/h ({a.free} free)"
            for a in self.alternatives
        )
        return f"{self.reason}. Free now: {listed}."


class FreeView:
    """Free and total units per offering key and node, each update O(1).

    Units are whole GPUs for a card key and MIG devices for a slice key. ``cpu`` needs no
    entry: CPU-only servers are always placeable.
    """

    def __init__(self) -> None:
        self._free: dict[str, dict[str, int]] = {}
        self._capacity: dict[str, dict[str, int]] = {}
        self._free_hist: dict[str, Counter[int]] = {}
        self._capacity_hist: dict[str, Counter[int]] = {}
        self._free_sum: Counter[str] = Counter()
        self._total_sum: Counter[str] = Counter()

    def set(self, key: str, node: str, free: int, capacity: int) -> None:
        """Record that ``node`` has ``capacity`` units of ``key``, ``free`` of them free."""
        if not 0 <= free <= capacity:
            raise ValueError(f"{node} {key}: free {free} outside 0..{capacity}")
        frees = self._free.setdefault(key, {})
        caps = self._capacity.setdefault(key, {})
        fh = self._free_hist.setdefault(key, Counter())
        ch = self._capacity_hist.setdefault(key, Counter())
        if node in frees:
            old_free, old_cap = frees[node], caps[node]
            fh[old_free] -= 1
            ch[old_cap] -= 1
            self._free_sum[key] -= old_free
            self._total_sum[key] -= old_cap
        if capacity == 0:
            frees.pop(node, None)
            caps.pop(node, None)
            return
        frees[node], caps[node] = free, capacity
        fh[free] += 1
        ch[capacity] += 1
        self._free_sum[key] += free
        self._total_sum[key] += capacity

    def take(self, key: str, node: str, count: int) -> None:
        self.set(key, node, self._free[key][node] - count, self._capacity[key][node])

    def free_only_on(self, nodes: Collection[str]) -> FreeView:
        """A copy in which nothing is free but on ``nodes``, capacities unchanged: for a
        server that must run there (Kubernetes: where its user's home volume can attach)."""
        view = FreeView()
        for key, caps in self._capacity.items():
            for name, capacity in caps.items():
                view.set(key, name, self._free[key][name] if name in nodes else 0, capacity)
        return view

    def free_on(self, key: str) -> Mapping[str, int]:
        return self._free.get(key, {})

    def max_free(self, key: str) -> int:
        hist = self._free_hist.get(key)
        return max((n for n, nodes in hist.items() if nodes > 0), default=0) if hist else 0

    def max_capacity(self, key: str) -> int:
        hist = self._capacity_hist.get(key)
        return max((n for n, nodes in hist.items() if nodes > 0), default=0) if hist else 0

    def free(self, key: str) -> int:
        return self._free_sum[key]

    def total(self, key: str) -> int:
        return self._total_sum[key]

    def keys(self) -> list[str]:
        return [k for k, total in self._total_sum.items() if total > 0]


# -- validation ---------------------------------------------------------------------------

_FIELDS = {
    "card": {"kind", "card", "count"},
    "slice": {"kind", "card", "mig_profile", "profile"},
    "shared": {"kind", "card"},
    "spec": {"kind", "min_memory_gb", "min_tflops", "count"},
    "cpu": {"kind"},
}


def _count(options: Mapping[str, Any]) -> int:
    count = options.get("count", 1)
    if isinstance(count, str):
        text = count.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= MAX_COUNT_DIGITS):
            raise RequestError(
                f"count must be a whole number of GPUs (1 to {MAX_COUNT}), not {shown(count)}"
            )
        count = int(text)
    if isinstance(count, bool) or not isinstance(count, int):
        raise RequestError(f"count must be a whole number of GPUs, not {shown(count)}")
    if count < 1:
        raise RequestError(f"count must be at least 1, not {count}")
    if count > MAX_COUNT:
        raise RequestError(f"count {count} is more than one server can hold (at most {MAX_COUNT})")
    return count


def _number(options: Mapping[str, Any], key: str, upper: float) -> float:
    value = options.get(key, 0)
    if isinstance(value, str):
        try:
            value = float(value) if value.strip() else 0
        except ValueError:
            raise RequestError(f"{key} must be a number, not {shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise RequestError(f"{key} must be a number, not {shown(value)}")
    if value < 0:
        raise RequestError(f"{key} must not be negative ({value})")
    if value > upper:
        raise RequestError(f"{key} {value} is beyond any GPU (at most {upper})")
    return float(value)


#: options any kind may carry, about how to run rather than what to run on
RUN_OPTIONS = ("queue", "spot")


@dataclass(frozen=True)
class ServerOptions:
    """A validated request plus how to run it: wait when sold out, interruptible (spot), paid
    by a course (its slug; billing checks the course's rules at admission)."""

    request: Request
    queue: bool = False
    spot: bool = False
    course: str = ""
    #: the environment's key ("": the default) or a free-text image ("": none); the spawner
    #: checks them against its catalog (spawner/core/environments.py)
    environment: str = ""
    image: str = ""
    #: after a GPU fault: wait for the same (``same``), or take a similar free GPU
    #: (``similar``) where the operator allows it (faults.restart: allowed)
    on_fault: str = "same"


#: what a server may do after a GPU fault (docs/gpu-faults.md)
ON_FAULT = ("same", "similar")

COURSE_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{1,62}")
#: the key of a slice's MIG profile, and the older name it is still accepted under
MIG_PROFILE_KEY = "mig_profile"
LEGACY_PROFILE_KEY = "profile"


def _flag(options: Mapping[str, Any], key: str) -> bool:
    value = options.get(key, False)
    if isinstance(value, str) and value.lower() in ("true", "on", "1", "false", "off", "0", ""):
        return value.lower() in ("true", "on", "1")
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false, not {shown(value)}")
    return value


def asks_to_wait(options: Mapping[str, Any] | None) -> bool:
    """Whether ``user_options`` ask to wait in the queue (False when they cannot say so:
    :func:`parse_options` refuses those)."""
    if not isinstance(options, Mapping):
        return False
    try:
        return _flag(options, "queue")
    except RequestError:
        return False


def parse_options(options: Mapping[str, Any] | None, catalog: Catalog) -> ServerOptions:
    """Validate ``user_options``: the request, the run options ``queue`` and ``spot``, the
    course that pays, and the environment (or free-text image) as text."""
    if options is not None and not isinstance(options, Mapping):
        raise RequestError('options must be an object such as {"kind": "card", ...}')
    options = dict(options or {})
    flags = {key: _flag(options, key) for key in RUN_OPTIONS}
    for key in RUN_OPTIONS:
        options.pop(key, None)
    course = options.pop("course", "") or ""
    if not isinstance(course, str) or (course and not COURSE_SLUG.fullmatch(course)):
        raise RequestError(f"course must be the slug of one of your courses, not {shown(course)}")
    if course and flags["spot"]:
        raise RequestError("a course pays for on-demand servers only; leave spot off")
    on_fault = options.pop("on_fault", "same")
    if on_fault not in ON_FAULT:
        raise RequestError(f"on_fault must be same or similar, not {shown(on_fault)}")
    environment = _text(options.pop("environment", ""), "environment", "the key of an environment")
    image = _text(options.pop("image", ""), "image", "an image reference")
    return ServerOptions(
        parse_request(options, catalog),
        **flags,
        course=course,
        environment=environment,
        image=image,
        on_fault=on_fault,
    )


def _text(value: Any, key: str, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RequestError(f"{key} must be {what} (a string), not {type(value).__name__}")
    return value


def parse_request(options: Mapping[str, Any] | None, catalog: Catalog) -> Request:
    """Validate ``user_options`` into a Request, or raise RequestError saying what is wrong."""
    if options is None or options == {}:
        return CpuRequest()
    if not isinstance(options, Mapping):
        raise RequestError('options must be an object such as {"kind": "card", ...}')
    kind = options.get("kind")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise RequestError(
            f"kind must be one of card, slice, shared, spec, cpu (not {shown(kind)})"
        )
    unknown = sorted(set(options) - _FIELDS[kind], key=str)
    if unknown:
        allowed = ", ".join(sorted(_FIELDS[kind]))
        names = ", ".join(shown(name) for name in unknown[:5])
        raise RequestError(f"unknown option(s) {names} for kind {kind}; use {allowed}")
    if kind == "cpu":
        return CpuRequest()
    if kind == "spec":
        return SpecRequest(
            min_memory_gb=_number(options, "min_memory_gb", MAX_SPEC_MEMORY_GB),
            min_tflops=_number(options, "min_tflops", MAX_SPEC_TFLOPS),
            count=_count(options),
        )
    sku = options.get("card")
    if not isinstance(sku, str) or not sku:
        raise RequestError('card must name a card, such as "A100-80GB"')
    try:
        card = catalog.card(sku)
    except ValueError as e:
        raise RequestError(str(e)) from None
    if kind == "card":
        return CardRequest(card.sku, _count(options))
    if kind == "shared":
        return SharedRequest(card.sku)
    profile = options.get(MIG_PROFILE_KEY, options.get(LEGACY_PROFILE_KEY))
    if options.get(LEGACY_PROFILE_KEY, profile) != profile:
        raise RequestError(f"{LEGACY_PROFILE_KEY} is the older name of {MIG_PROFILE_KEY}; send one")
    if not isinstance(profile, str) or card.profile(profile) is None:
        names = ", ".join(p.name for p in card.mig_profiles) or "none: it has no MIG"
        raise RequestError(f"{card.sku} has no MIG profile {shown(profile)}; its profiles: {names}")
    return SliceRequest(card.sku, profile)


def canonical_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``user_options`` with the slice's MIG profile under its own key (``profile``, the
    older name, is KubeSpawner's key for its profiles and must not reach it)."""
    result = dict(options or {})
    if LEGACY_PROFILE_KEY in result and MIG_PROFILE_KEY not in result:
        result[MIG_PROFILE_KEY] = result.pop(LEGACY_PROFILE_KEY)
    return result


def request_for(offering: Offering, count: int = 1) -> Request:
    """The request that asks for exactly this offering."""
    if offering.kind == "slice":
        return SliceRequest(offering.card, offering.profile)
    if offering.kind == "shared":
        return SharedRequest(offering.card)
    if offering.kind == "card":
        return CardRequest(offering.card, count)
    return CpuRequest()


# -- placement ----------------------------------------------------------------------------


def _best_node(view: FreeView, key: str, count: int) -> str | None:
    """Best fit: the node with the fewest free units that still holds ``count``; then name."""
    best: tuple[int, str] | None = None
    for node, free in view.free_on(key).items():
        if free >= count and (best is None or (free, node) < best):
            best = (free, node)
    return best[1] if best else None


def _rank(offering: Offering, price: int) -> tuple[int, float, float, str]:
    return (price, -offering.fp16_tflops, -offering.memory_gb, offering.key)


def _fits(offering: Offering, memory_gb: float, tflops: float, count: int) -> bool:
    if offering.kind == "cpu":
        return False
    if offering.kind == "shared":
        return False  # nothing is guaranteed of a shared GPU
    if offering.kind == "slice" and count > 1:
        return False
    return offering.memory_gb >= memory_gb and offering.fp16_tflops >= tflops


def _alternatives(
    view: FreeView,
    catalog: Catalog,
    prices: Mapping[str, int],
    memory_gb: float,
    tflops: float,
    count: int,
    exclude: str | None,
    limit: int = 4,
) -> tuple[Alternative, ...]:
    free = [
        (o, prices[o.key])
        for key in view.keys()
        if key != exclude and key in prices and view.max_free(key) >= count
        for o in (catalog.offering(key),)
        if o.kind not in ("slice", "shared") or count == 1
    ]
    fitting = [(o, p) for o, p in free if _fits(o, memory_gb, tflops, count)]
    chosen = sorted(fitting or free, key=lambda op: _rank(*op))[:limit]
    return tuple(Alternative(o, view.free(o.key), p) for o, p in chosen)


def place(
    request: Request, view: FreeView, catalog: Catalog, prices: Mapping[str, int]
) -> Placement | Refusal:
    """Answer a validated request from what is free now.

    Raises RequestError for requests no machine here could ever serve (a card this platform
    does not have, more GPUs than one machine holds, no price for it).
    """
    if isinstance(request, CpuRequest):
        if CPU_KEY not in prices:
            raise RequestError("CPU-only servers have no price; ask an operator to set one")
        return Placement(catalog.cpu, 1, "", prices[CPU_KEY])

    if isinstance(request, SpecRequest):
        candidates = sorted(
            (
                (o, prices[o.key])
                for o in catalog.offerings()
                if o.key in prices
                and _fits(o, request.min_memory_gb, request.min_tflops, 1)
                and (o.kind == "card" or request.count == 1)
            ),
            key=lambda op: _rank(*op),
        )
        exists = False
        for offering, price in candidates:
            if view.max_capacity(offering.key) >= request.count:
                exists = True
                if view.max_free(offering.key) >= request.count:
                    node = _best_node(view, offering.key, request.count)
                    assert node is not None
                    return Placement(offering, request.count, node, price)
        need = (
            f"{request.count}× GPU with ≥ {request.min_memory_gb:g} GB"
            f" and ≥ {request.min_tflops:g} TFLOPS"
        )
        if not exists:
            raise RequestError(f"no machine here has {need}; lower the memory, TFLOPS or count")
        return Refusal(
            f"No {need} is free now",
            _alternatives(view, catalog, prices, 0, 0, request.count, None),
        )

    if isinstance(request, SliceRequest | SharedRequest):
        key, count = request.key, 1
    else:
        key, count = request.card, request.count
    offering = catalog.offering(key)
    capacity = view.max_capacity(key)
    if capacity == 0:
        raise RequestError(f"this platform has no {offering.label}; choose another option")
    if key not in prices:
        raise RequestError(f"{offering.label} has no price; ask an operator to set one")
    if count > capacity:
        raise RequestError(
            f"{count}× {offering.label} do not fit on one machine here (at most {capacity})"
        )
    node = _best_node(view, key, count)
    if node is not None:
        return Placement(offering, count, node, prices[key])
    what = offering.label if count == 1 else f"{count}× {offering.label} on one machine"
    return Refusal(
        f"No {what} free now ({view.free(key)} of {view.total(key)} free)",
        _alternatives(
            view, catalog, prices, offering.memory_gb, offering.fp16_tflops, count, exclude=key
        ),
    )
