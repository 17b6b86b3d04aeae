"""Hardware facts as data: GPU cards, their MIG profiles, and what a user can be offered.

The shipped facts live in ``catalog.yaml`` beside this module; operators add or edit cards in
their settings (``catalog.cards``) without code. A GPU that NVML reports and the catalog does
not know becomes a :func:`discovered_card` (its name and memory as NVML says, its speed
unknown), added with :meth:`Catalog.with_cards`. Nothing here does I/O beyond reading that
file, and nothing here knows prices: those live in billing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml

from gputap_common.bodies import shown

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
CPU_KEY = "cpu"
#: The most GPU instance slices a MIG-capable card has (A100, H100, H200, B200: 7; A30: 4,
#: see :attr:`Card.mig_slices`).
MIG_FULL_SLICES = 7
#: the prefix current drivers put before every name ("NVIDIA A100-SXM4-80GB") and older ones
#: left out ("A100-SXM4-80GB"); names match with or without it
NVIDIA_PREFIX = "NVIDIA "
#: SKUs that name something other than a card in options and price books
RESERVED_SKUS = frozenset({CPU_KEY, "disk"})
_PROFILE_RE = re.compile(r"(?P<g>[1-7])g\.(?P<mem>\d+)gb")

OfferingKind = Literal["card", "slice", "shared", "cpu"]
#: the "profile" part of a time-sliced shared GPU's key: "A100-80GB/shared"
SHARED = "shared"


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile such as ``1g.10gb``: compute slices, memory, maximum instances per card."""

    name: str
    compute_slices: int
    memory_gb: int
    max_instances: int

    @classmethod
    def parse(cls, name: str, max_instances: int) -> MigProfile:
        match = _PROFILE_RE.fullmatch(str(name))
        if not match:
            raise ValueError(f"MIG profile {name!r} is not of the form '<g>g.<memory>gb'")
        if not isinstance(max_instances, int) or not 1 <= max_instances <= MIG_FULL_SLICES:
            raise ValueError(
                f"MIG profile {name}: max instances must be 1..7, not {max_instances!r}"
            )
        return cls(name, int(match["g"]), int(match["mem"]), max_instances)


@dataclass(frozen=True)
class Card:
    """One GPU model. ``sku`` is the short name used in options, prices and labels."""

    sku: str
    name: str
    memory_gb: float
    fp16_tflops: float
    products: tuple[str, ...]
    mig_profiles: tuple[MigProfile, ...] = ()
    cpu_per_gpu: float = 4
    memory_gb_per_gpu: float = 16
    #: False for a GPU the catalog does not know (:func:`discovered_card`): its memory is
    #: what NVML reports and its speed is unknown (``fp16_tflops`` 0.0)
    known: bool = True

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)

    @property
    def mig_slices(self) -> int:
        """Compute slices of the whole card: 7 on an A100 or H100, 4 on an A30. The most
        ``g`` × instances of any of its profiles (``1g.6gb`` × 4 on an A30); 0 without MIG."""
        return max((p.compute_slices * p.max_instances for p in self.mig_profiles), default=0)


@dataclass(frozen=True)
class Offering:
    """Something a user can ask for: a whole card, one MIG slice, or CPU only.

    ``key`` is how options, prices and inventories name it: ``A100-80GB``,
    ``A100-80GB/1g.10gb`` or ``cpu``.
    """

    key: str
    kind: OfferingKind
    name: str
    memory_gb: float
    fp16_tflops: float
    card: str | None = None
    profile: str | None = None
    #: False when the card's speed is unknown (``fp16_tflops`` is then 0.0): a spec request
    #: with a TFLOPS minimum never matches it
    known: bool = True

    @property
    def label(self) -> str:
        """Short human label: "A100-80GB", "A100-80GB 1g.10gb slice", "CPU only"."""
        if self.kind == "slice":
            return f"{self.card} {self.profile} slice"
        if self.kind == "shared":
            return f"{self.card} shared (time-sliced)"
        return self.name if self.kind == "cpu" else self.key


def offering_key(card: str, profile: str | None = None) -> str:
    return f"{card}/{profile}" if profile else card


def _card_from_data(sku: str, data: Mapping[str, Any]) -> Card:
    def number(key: str, default: float | None = None) -> float:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"card {sku}: {key} must be a positive number, not {value!r}")
        return float(value)

    products = data.get("products")
    if not products or not all(isinstance(p, str) and p for p in products):
        raise ValueError(f"card {sku}: products must be a list of GFD product labels")
    profiles = data.get("mig_profiles") or {}
    if not isinstance(profiles, Mapping):
        raise ValueError(f"card {sku}: mig_profiles must map profile -> max instances")
    return Card(
        sku=sku,
        name=str(data.get("name") or sku),
        memory_gb=number("memory_gb"),
        fp16_tflops=number("fp16_tflops"),
        products=tuple(products),
        # smallest slice first, the whole card last: 1g.5gb, 1g.10gb, 2g.10gb, ... 7g.40gb
        mig_profiles=tuple(
            sorted(
                (MigProfile.parse(name, count) for name, count in profiles.items()),
                key=lambda p: (p.compute_slices, p.memory_gb),
            )
        ),
        cpu_per_gpu=number("cpu_per_gpu", 4),
        memory_gb_per_gpu=number("memory_gb_per_gpu", 16),
    )


class Catalog:
    """Cards by SKU plus the CPU-only offering, with lookups by product label."""

    def __init__(
        self,
        cards: Iterable[Card],
        cpu_name: str = "CPU only",
        cpu_cores: float = 2,
        cpu_memory_gb: float = 4,
    ):
        self.cards: dict[str, Card] = {card.sku: card for card in cards}
        self.cpu = Offering(CPU_KEY, "cpu", cpu_name, 0.0, 0.0)
        #: what a CPU-only server is guaranteed (a Kubernetes pod's requests)
        self.cpu_cores = cpu_cores
        self.cpu_memory_gb = cpu_memory_gb

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Catalog:
        cards = data.get("cards") or {}
        if not isinstance(cards, Mapping):
            raise ValueError("catalog cards must be a mapping of SKU -> facts")
        for sku in cards:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(sku)) or sku == CPU_KEY:
                raise ValueError(f"card SKU {sku!r}: use letters, digits, '-', '_' or '.'")
        cpu = data.get("cpu") or {}
        built = [_card_from_data(str(sku), facts or {}) for sku, facts in cards.items()]
        claimed: dict[str, str] = {}
        for card in built:
            for product in card.products:
                other = claimed.setdefault(_norm(product), card.sku)
                if other != card.sku:
                    raise ValueError(
                        f"product {product!r} is listed by both {other} and {card.sku}; "
                        "a name the driver reports must belong to one card"
                    )
        sizes = {}
        for key, name in (("cpu", "cpu_cores"), ("memory_gb", "cpu_memory_gb")):
            if key in cpu:
                value = cpu[key]
                if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                    raise ValueError(f"catalog cpu: {key} must be a positive number, not {value!r}")
                sizes[name] = float(value)
        return cls(built, cpu_name=str(cpu.get("name") or "CPU only"), **sizes)

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> Catalog:
        """The shipped catalog with an operator's ``catalog:`` settings merged over it."""
        data = yaml.safe_load(CATALOG_PATH.read_text())
        for sku, facts in ((overrides or {}).get("cards") or {}).items():
            base = data["cards"].get(sku, {})
            data["cards"][sku] = {**base, **(facts or {})}
        return cls.from_data(data)

    def with_cards(self, cards: Iterable[Card]) -> Catalog:
        """A new catalog with ``cards`` added (GPUs NVML found that this catalog does not
        know); a card whose SKU this catalog has stays as the catalog has it."""
        added = [*self.cards.values()]
        for card in cards:
            if all(card.sku != c.sku for c in added):
                added.append(card)
        return Catalog(added, self.cpu.name, self.cpu_cores, self.cpu_memory_gb)

    def card(self, sku: str) -> Card:
        try:
            return self.cards[sku]
        except KeyError:
            known = ", ".join(sorted(self.cards))
            raise ValueError(f"unknown card {shown(sku)}; known cards: {known}") from None

    @cached_property
    def _offerings(self) -> dict[str, Offering]:
        result: dict[str, Offering] = {}
        for card in self.cards.values():
            result[card.sku] = Offering(
                card.sku, "card", card.name, card.memory_gb, card.fp16_tflops, card=card.sku,
                known=card.known,
            )  # fmt: skip
            for p in card.mig_profiles:
                key = offering_key(card.sku, p.name)
                tflops = round(card.fp16_tflops * p.compute_slices / card.mig_slices, 1)
                result[key] = Offering(
                    key, "slice", f"{card.name} {p.name}", p.memory_gb, tflops, card.sku, p.name,
                    known=card.known,
                )  # fmt: skip
            # time-sliced (nvidia.com/gpu.shared): the card's memory and compute, shared with
            # others, so no spec request ever matches it
            key = offering_key(card.sku, SHARED)
            result[key] = Offering(
                key, "shared", f"{card.name} (shared)", card.memory_gb, card.fp16_tflops,
                card.sku, SHARED, known=card.known,
            )  # fmt: skip
        result[CPU_KEY] = self.cpu
        return result

    def offerings(self) -> list[Offering]:
        return list(self._offerings.values())

    def offering(self, key: str) -> Offering:
        try:
            return self._offerings[key]
        except KeyError:
            raise ValueError(f"unknown card or slice {shown(key)}") from None

    @cached_property
    def _by_product(self) -> dict[str, Card]:
        by_product: dict[str, Card] = {}
        for card in self.cards.values():  # the catalog's own cards before any added later
            for product in card.products:
                by_product.setdefault(_norm(product), card)
        return by_product

    def card_for_product(self, product: str) -> Card | None:
        """The card for a GFD product label or an NVML device name, from any driver: with
        or without the leading "NVIDIA ", spaces or dashes alike, MIG suffixes ignored
        ("A100-SXM4-40GB MIG 1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")."""
        name = re.sub(r"[- ]MIG[- ].*\Z", "", product.strip(), flags=re.DOTALL)
        return self._by_product.get(_norm(name)) if name else None


def _norm(name: str) -> str:
    """How names compare: case, runs of spaces, dashes or underscores, and the "NVIDIA"
    prefix of current drivers do not count ("NVIDIA H200" and "h200" are one name)."""
    norm = re.sub(r"[\s_-]+", "-", name.strip()).lower()
    return norm.removeprefix("nvidia-") if norm != "nvidia" else ""


def discovered_card(name: str, memory_mib: int) -> Card:
    """A card for a GPU NVML reports that the catalog does not know: what NVML says of it.

    ``name`` is NVML's device name, ``memory_mib`` its total memory. The SKU is the name
    without "NVIDIA ", each run of characters other than letters, digits, ``.`` and ``-``
    made one ``-``, at most 64 characters, as billing's rule for SKUs wants: "NVIDIA RTX PRO
    6000 Blackwell Server Edition" gives "RTX-PRO-6000-Blackwell-Server-Edition". Memory is
    in GB as the catalog counts them (MiB / 1024, one decimal); no MIG profiles; speed
    unknown (``known`` False, ``fp16_tflops`` 0.0), so a spec request with a TFLOPS minimum
    never gets it. It is unpriced until an operator sets ``billing.prices.<SKU>``; facts
    under ``catalog.cards.<SKU>`` (with this name among its products) make it a known card.
    """
    if not isinstance(name, str) or not name.strip().removeprefix(NVIDIA_PREFIX.strip()).strip():
        raise ValueError(f"a GPU with no name ({name!r}) cannot be offered")
    name = name.strip()
    bare = name[len(NVIDIA_PREFIX) :] if name.startswith(NVIDIA_PREFIX) else name
    # billing's SKU rule: letters, digits, '.' and '-', at most 64
    sku = re.sub(r"[^A-Za-z0-9.-]+", "-", bare).strip("-")[:64].rstrip("-")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", sku):
        raise ValueError(f"GPU {name!r}: its name needs letters or digits to make a SKU")
    if sku.lower() in RESERVED_SKUS:
        raise ValueError(f"GPU {name!r}: {sku!r} is reserved ({', '.join(sorted(RESERVED_SKUS))})")
    if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib <= 0:
        raise ValueError(
            f"GPU {name!r}: memory must be a positive number of MiB, not {memory_mib!r}"
        )
    return Card(
        sku=sku,
        name=name,
        memory_gb=round(memory_mib / 1024, 1),
        fp16_tflops=0.0,
        products=(re.sub(r"\s+", "-", name),),
        known=False,
    )


_CATALOGS: dict[str, Catalog] = {}


def load_catalog(cards: dict[str, Any]) -> Catalog:
    """The catalog with operator edits, built once per distinct configuration."""
    key = json.dumps(cards, sort_keys=True)
    if key not in _CATALOGS:
        _CATALOGS[key] = Catalog.load({"cards": cards})
    return _CATALOGS[key]
