"""The environment catalog: what a server runs (an image on Kubernetes, a Python environment's
``jupyterhub-singleuser`` on one machine), who may choose it and what it needs. Pure.

The catalog comes from the ``environments:`` settings (:func:`environments_from_settings`,
which refuses a catalog that cannot work with a ``SettingsError`` naming the key); a start
names one with ``user_options`` ``environment`` (its key; none: the default), or, where the
operator allows it, a free-text ``image`` (:func:`free_image`). :func:`fit_request` says
whether the GPU asked for meets the environment's needs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gputap_common.settings import SettingsError

from .catalog import CPU_KEY, Catalog, Offering
from .placement import (
    CpuRequest,
    Request,
    RequestError,
    SharedRequest,
    SliceRequest,
    SpecRequest,
)

#: the environment key of a server started from a free-text image: ``image:`` + the image
FREE_IMAGE_PREFIX = "image:"
#: the longest image reference accepted (the settings' and the request's)
MAX_IMAGE_LENGTH = 255
#: how much of a value a refusal shows
SHOWN_LENGTH = 40
#: how many allowed environments a refusal lists
LISTED = 20


@dataclass(frozen=True)
class Environment:
    """One environment of the catalog (the ``environments.KEY`` settings)."""

    key: str
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    #: the group the spawn form lists it under ("": Other)
    framework: str = ""
    #: Kubernetes: the servers' image ("": the spawner's configured image)
    image: str = ""
    #: one machine: the Python environment holding its jupyterhub-singleuser ("": the hub's)
    python: str = ""
    needs_gpu: bool = False
    min_gpu_memory_gb: float = 0
    #: who may choose it: members of these groups, students of these courses; both empty: all
    groups: tuple[str, ...] = ()
    courses: tuple[str, ...] = ()
    default: bool = False

    @property
    def for_everyone(self) -> bool:
        return not self.groups and not self.courses

    @property
    def free_image(self) -> bool:
        """Whether this is a user's free-text image rather than a catalog entry."""
        return self.key.startswith(FREE_IMAGE_PREFIX)

    def allows(self, groups: Collection[str], courses: Collection[str]) -> bool:
        """Whether a member of ``groups`` and student of ``courses`` may choose it."""
        if self.for_everyone:
            return True
        mine = {g.lower() for g in groups}
        return bool(mine & {g.lower() for g in self.groups}) or bool(
            set(courses) & set(self.courses)
        )


def environment_of(key: str, entry: Mapping[str, Any]) -> Environment:
    """The settings entry ``environments.KEY`` (defaults filled in) as an Environment."""
    needs = entry.get("needs") or {}
    allowed = entry.get("allowed") or {}
    return Environment(
        key=key,
        name=str(entry["name"]),
        description=str(entry.get("description") or ""),
        tags=tuple(entry.get("tags") or ()),
        framework=str(entry.get("framework") or ""),
        image=str(entry.get("image") or ""),
        python=str(entry.get("python") or ""),
        needs_gpu=bool(needs.get("gpu", False)),
        min_gpu_memory_gb=float(needs.get("min_gpu_memory_gb") or 0),
        groups=tuple(allowed.get("groups") or ()),
        courses=tuple(allowed.get("courses") or ()),
        default=bool(entry.get("default", False)),
    )


class Environments:
    """The catalog: every environment by key, and the default one."""

    def __init__(self, environments: Collection[Environment], image_pattern: str = ""):
        self.by_key = {e.key: e for e in environments}
        defaults = [e for e in environments if e.default]
        if len(defaults) != 1:
            raise ValueError("an environment catalog has exactly one default")
        self.default = defaults[0]
        #: free-text images users may ask for (matched whole); "": none
        self.image_pattern = image_pattern

    def allowed(self, groups: Collection[str], courses: Collection[str]) -> list[Environment]:
        return [e for e in self.by_key.values() if e.allows(groups, courses)]

    def resolve(self, key: str) -> Environment:
        """The environment a server record names (a free-text image's too); the default for
        "" (a server started before environments existed)."""
        if not key:
            return self.default
        if key.startswith(FREE_IMAGE_PREFIX):
            image = key[len(FREE_IMAGE_PREFIX) :]
            return Environment(key=key, name=image, image=image)
        return self.by_key.get(key, self.default)

    def choose(
        self,
        key: str,
        image: str,
        groups: Collection[str],
        courses: Collection[str],
    ) -> Environment:
        """The environment a start asks for (``key``, else a free-text ``image``, else the
        default), if this user may choose it; RequestError (400) saying what they may."""
        if key and image:
            raise RequestError("send environment or image, not both")
        if image:
            return self._free_image(image)
        if not key:
            return self.default
        found = self.by_key.get(key)
        if found is not None and found.allows(groups, courses):
            return found
        allowed = sorted(e.key for e in self.allowed(groups, courses))
        listed = ", ".join(allowed[:LISTED]) + (" …" if len(allowed) > LISTED else "")
        what = "is not one of yours" if found is not None else "is not an environment here"
        raise RequestError(f"environment {shown(key)} {what}; you may use: {listed}")

    def _free_image(self, image: str) -> Environment:
        if not self.image_pattern:
            raise RequestError(
                "free-text images are not allowed here; choose an environment instead"
            )
        if len(image) > MAX_IMAGE_LENGTH or not re.fullmatch(self.image_pattern, image):
            raise RequestError(
                f"image {shown(image)} is not allowed here: it must match "
                f"{self.image_pattern}; or choose an environment instead"
            )
        return Environment(key=FREE_IMAGE_PREFIX + image, name=image, image=image)


def shown(value: str) -> str:
    """``value`` as a refusal shows it: quoted, and shortened when long."""
    if len(value) <= SHOWN_LENGTH:
        return repr(value)
    return f"{value[: SHOWN_LENGTH - 10]!r}… ({len(value)} characters)"


def unfit_reason(environment: Environment, offering: Offering) -> str:
    """Why a server of ``environment`` cannot run on ``offering`` ("" when it can): the one
    rule the spawner applies to a request and the spawn form shows before it is posted."""
    need = environment.min_gpu_memory_gb
    if offering.kind == "cpu":
        return "needs a GPU" if environment.needs_gpu or need > 0 else ""
    if need <= 0:
        return ""
    if offering.kind == "shared":
        return f"needs ≥ {need:g} GB of GPU memory; a shared GPU guarantees none"
    if offering.memory_gb < need:
        return f"needs ≥ {need:g} GB of GPU memory; {offering.label} has {offering.memory_gb:g} GB"
    return ""


def fit_request(environment: Environment, request: Request, catalog: Catalog) -> Request:
    """``request`` if the GPU it asks for meets what ``environment`` needs (a spec asks for at
    least the memory the environment needs); RequestError (400) saying why not."""
    if isinstance(request, SpecRequest):
        need = environment.min_gpu_memory_gb
        if request.min_memory_gb >= need:
            return request
        return SpecRequest(need, request.min_tflops, request.count)
    if isinstance(request, CpuRequest):
        offering, instead = catalog.offering(CPU_KEY), "choose a card, a slice or a spec, not CPU"
    elif isinstance(request, SharedRequest):
        offering, instead = catalog.offering(request.key), "choose a card, a slice or a spec"
    else:
        key = request.key if isinstance(request, SliceRequest) else request.card
        offering, instead = catalog.offering(key), "choose a larger card or slice"
    reason = unfit_reason(environment, offering)
    if reason:
        raise RequestError(f"environment {environment.key} {reason}; {instead}")
    return request


def environments_from_settings(
    section: Mapping[str, Mapping[str, Any]], backend: str, image_pattern: str = ""
) -> Environments:
    """The catalog of the ``environments:`` settings (checked against the schema, defaults
    filled in) for ``backend`` ("local" or "kubernetes"); a SettingsError naming the key when
    it cannot work: no default or two, a default not allowed to everyone, an environment the
    backend cannot run (an image without a python on one machine, the reverse on Kubernetes),
    a free-text image pattern that is no regular expression."""
    for key, entry in section.items():
        if not entry.get("name"):
            raise SettingsError(
                f"environments.{key} needs name: what users see, e.g. PyTorch 2.13 (CUDA 12.8)"
            )
    environments = [environment_of(key, entry) for key, entry in section.items()]
    if not environments:
        raise SettingsError("environments is empty: declare at least one, with default: true")
    defaults = [e.key for e in environments if e.default]
    if not defaults:
        raise SettingsError(
            "environments: none is the default; set default: true on one "
            f"({', '.join(sorted(section))})"
        )
    if len(defaults) > 1:
        listed = " and ".join(f"environments.{k}" for k in defaults)
        raise SettingsError(
            f"{listed} are each the default; set default: false on all but one "
            "(gputap, gputap's own, is the default unless you say otherwise)"
        )
    default = next(e for e in environments if e.default)
    if not default.for_everyone:
        raise SettingsError(
            f"environments.{default.key} is the default but allowed only to some; a server "
            "started without an environment runs the default, so it must be allowed to "
            "everyone: empty its allowed, or make another the default"
        )
    for e in environments:
        where = f"environments.{e.key}"
        if backend == "local" and e.image and not e.python:
            raise SettingsError(
                f"{where} has an image ({e.image}) but no python: on one machine servers "
                "run a Python environment's jupyterhub-singleuser; set its python to one"
            )
        if backend == "kubernetes" and e.python and not e.image:
            raise SettingsError(
                f"{where} has a python ({e.python}) but no image: on Kubernetes servers "
                "run an image; set its image to one that holds that environment"
            )
    if image_pattern:
        try:
            re.compile(image_pattern)
        except re.error as e:
            raise SettingsError(
                f"spawner.kubernetes.image_pattern is not a regular expression: {e}"
            ) from None
        if backend != "kubernetes":
            raise SettingsError(
                "spawner.kubernetes.image_pattern allows free-text images, which only the "
                "Kubernetes backend runs; leave it empty on one machine"
            )
    return Environments(environments, image_pattern)
