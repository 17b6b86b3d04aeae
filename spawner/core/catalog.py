"""Hardware facts as data: GPU cards, their MIG profiles, and what a user can be offered.

The shipped facts live in ``catalog.yaml`` beside this module; operators add or edit cards in
their settings (``catalog.cards``) without code. Nothing here does I/O beyond reading that file,
and nothing here knows prices: those live in billing.
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

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
CPU_KEY = "cpu"
#: GPU instance slices a full MIG-capable card has (A100, H100, H200, H800 alike).
MIG_FULL_SLICES = 7
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

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


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
        mig_profiles=tuple(
            MigProfile.parse(name, count) for name, count in sorted(profiles.items())
        ),
        cpu_per_gpu=number("cpu_per_gpu", 4),
        memory_gb_per_gpu=number("memory_gb_per_gpu", 16),
    )


class Catalog:
    """Cards by SKU plus the CPU-only offering, with lookups by product label."""

    def __init__(self, cards: Iterable[Card], cpu_name: str = "CPU only"):
        self.cards: dict[str, Card] = {card.sku: card for card in cards}
        self.cpu = Offering(CPU_KEY, "cpu", cpu_name, 0.0, 0.0)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Catalog:
        cards = data.get("cards") or {}
        if not isinstance(cards, Mapping):
            raise ValueError("catalog cards must be a mapping of SKU -> facts")
        for sku in cards:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(sku)) or sku == CPU_KEY:
                raise ValueError(f"card SKU {sku!r}: use letters, digits, '-', '_' or '.'")
        cpu = data.get("cpu") or {}
        return cls(
            [_card_from_data(str(sku), facts or {}) for sku, facts in cards.items()],
            cpu_name=str(cpu.get("name") or "CPU only"),
        )

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> Catalog:
        """The shipped catalog with an operator's ``catalog:`` settings merged over it."""
        data = yaml.safe_load(CATALOG_PATH.read_text())
        for sku, facts in ((overrides or {}).get("cards") or {}).items():
            base = data["cards"].get(sku, {})
            data["cards"][sku] = {**base, **(facts or {})}
        return cls.from_data(data)

    def card(self, sku: str) -> Card:
        try:
            return self.cards[sku]
        except KeyError:
            known = ", ".join(sorted(self.cards))
            raise ValueError(f"unknown card {sku!r}; known cards: {known}") from None

    @cached_property
    def _offerings(self) -> dict[str, Offering]:
        result: dict[str, Offering] = {}
        for card in self.cards.values():
            result[card.sku] = Offering(
                card.sku, "card", card.name, card.memory_gb, card.fp16_tflops, card=card.sku
            )
            for p in card.mig_profiles:
                key = offering_key(card.sku, p.name)
                tflops = round(card.fp16_tflops * p.compute_slices / MIG_FULL_SLICES, 1)
                result[key] = Offering(
                    key, "slice", f"{card.name} {p.name}", p.memory_gb, tflops, card.sku, p.name
                )
            # time-sliced (nvidia.com/gpu.shared): the card's memory and compute, shared with
            # others, so no spec request ever matches it
            key = offering_key(card.sku, SHARED)
            result[key] = Offering(
                key, "shared", f"{card.name} (shared)", card.memory_gb, card.fp16_tflops,
                card.sku, SHARED,
            )  # fmt: skip
        result[CPU_KEY] = self.cpu
        return result

    def offerings(self) -> list[Offering]:
        return list(self._offerings.values())

    def offering(self, key: str) -> Offering:
        try:
            return self._offerings[key]
        except KeyError:
            raise ValueError(f"unknown card or slice {key!r}") from None

    @cached_property
    def _by_product(self) -> dict[str, Card]:
        return {_norm(p): card for card in self.cards.values() for p in card.products}

    def card_for_product(self, product: str) -> Card | None:
        """The card for a GFD product label or an NVML device name (MIG suffixes ignored)."""
        name = re.sub(r"[- ]MIG[- ].*$", "", product.strip())
        return self._by_product.get(_norm(name))


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).lower()


_CATALOGS: dict[str, Catalog] = {}


def load_catalog(cards: dict[str, Any]) -> Catalog:
    """The catalog with operator edits, built once per distinct configuration."""
    key = json.dumps(cards, sort_keys=True)
    if key not in _CATALOGS:
        _CATALOGS[key] = Catalog.load({"cards": cards})
    return _CATALOGS[key]
