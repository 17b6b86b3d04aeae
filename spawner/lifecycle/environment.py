"""Which environment a server runs (spawner/core/environments.py), for every backend: the
catalog from the settings, the choice a start asks for checked against who the user is and the
GPU asked for, and the environment of the running server."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from tornado import web

from ..core.catalog import Catalog
from ..core.environment_form import OWN_IMAGE, Picker
from ..core.environments import Environment, Environments, environments_from_settings, fit_request
from ..core.placement import RequestError, ServerOptions
from .billing_client import BillingClient, BillingRefused, BillingUnavailable, unavailable_error


class EnvironmentChoice:
    """The environments of the settings and one user's choice among them: a collaborator of
    :class:`~.mixin.GPUSpawnerMixin`, given its settings (``environments``, the backend's
    name, ``image_pattern``), the user, billing and the GPU catalog."""

    def __init__(
        self,
        environments: Mapping[str, Any],
        *,
        backend_name: str = "local",
        image_pattern: str = "",
        user: Any = None,
        billing: BillingClient | None = None,
        catalog: Catalog | None = None,
    ):
        self.environments = environments
        self.backend_name = backend_name
        self.image_pattern = image_pattern
        self.user = user
        self.billing = billing
        self.catalog = catalog

    @property
    def environment_catalog(self) -> Environments:
        """The environments of the settings (checked at the hub's start, so valid here)."""
        return environments_from_settings(self.environments, self.backend_name, self.image_pattern)

    def environment_picker(
        self, courses: Collection[str], picked: Mapping[str, Any] | None = None
    ) -> Picker | None:
        """The spawn form's environment picker: the environments this user may choose (by
        the hub's groups and ``courses``, the slugs of theirs), the one asked for last time
        (``picked``: a refused start's options) or the default checked; None when there is
        nothing to choose (the default alone, no free-text image)."""
        catalog = self.environment_catalog
        groups = [group.name for group in self.user.groups]
        allowed = catalog.allowed(groups, courses)
        if len(allowed) <= 1 and not catalog.image_pattern:
            return None
        picked = picked or {}
        image = str(picked.get("image") or "")
        selected = OWN_IMAGE if image else str(picked.get("environment") or "")
        if selected != OWN_IMAGE and selected not in {e.key for e in allowed}:
            selected = catalog.default.key
        return Picker(allowed, selected, catalog.image_pattern, image)

    async def environment_for(self, options: ServerOptions) -> tuple[Environment, ServerOptions]:
        """The environment ``options`` ask for, if this user may have it, and the options
        with their request as it meets the environment's needs (a spec asks for the memory
        the environment needs); 400 saying what the user may choose otherwise. A course that
        pays pins its environment when its instructor chose one. The user's courses are asked
        of billing only where a course pays or an environment is limited to courses."""
        if options.image and self.backend_name != "kubernetes":
            raise web.HTTPError(
                400,
                "Invalid server options: free-text images are not allowed here (only the "
                "Kubernetes backend runs images); choose an environment instead",
            )
        catalog = self.environment_catalog
        groups = [group.name for group in self.user.groups]
        taken: list[dict] = []
        if options.course or any(e.courses for e in catalog.by_key.values()):
            try:
                taken = list((await self.billing.courses(self.user.name))["courses"])
            except BillingUnavailable as e:
                raise unavailable_error(e) from None
            except BillingRefused:
                taken = []  # no account yet: no courses
        courses = [c["slug"] for c in taken]
        key = options.environment
        pinned = next((c.get("environment") for c in taken if c["slug"] == options.course), "")
        if pinned and (options.image or key not in ("", pinned)):
            raise web.HTTPError(
                400,
                f"Invalid server options: course {options.course} runs its servers in "
                f"environment {pinned}; leave environment out, or start without the course",
            )
        try:
            environment = catalog.choose(pinned or key, options.image, groups, courses)
            request = fit_request(environment, options.request, self.catalog)
        except RequestError as e:
            raise web.HTTPError(400, f"Invalid server options: {e}") from None
        return environment, dataclasses.replace(options, request=request)
