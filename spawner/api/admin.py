"""The hub's admin API for accounts: moving a renamed user's account to their new name.

``POST {base_url}hub/gputap/api/admin/users/{old}/move`` with ``{"to": "new"}`` (docs/github.md,
"Renamed logins: moving an account"). GitHub frees a renamed login; the person signs in with
the new one (a new, empty user with trial credit) and an admin moves the old account there:
the hub user ``old`` is renamed ``new`` (groups, tokens, roles and the stored GitHub id
follow; the empty user ``new`` is deleted), its billing account with all its history, and its
home and data disks.

The steps, in an order where a failure leaves both accounts usable: every check first; the
files (each folder one rename; moved back if a later step fails); billing (one transaction,
its own checks: moved back if the hub's step fails); the hub's users (one database commit).
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyterhub.metrics import TOTAL_USERS
from jupyterhub.scopes import has_scope
from jupyterhub.user import User
from jupyterhub.utils import maybe_future
from tornado import web

from gputap_common.bodies import shown
from gputap_common.names import server_label

from ..lifecycle.billing_client import BillingClient, BillingRefused, BillingUnavailable
from ..lifecycle.moving import MoveRefused
from .base import API_PATH, GPUTapAPIHandler

#: under the hub's base URL: {base_url}hub/gputap/api/admin/users/{old}/move
MOVE_PATH = f"{API_PATH}/admin/users"
#: moves run one at a time: two moves naming the same user must not interleave
_moving = asyncio.Lock()


def busy_servers(user: User) -> list[str]:
    """The user's servers that run, start or stop now (``alice``, ``alice/gpu``)."""
    busy = []
    for name in sorted(user.orm_user.orm_spawners):
        spawner = user.spawners[name]
        if spawner.active or spawner.pending:
            busy.append(server_label(user.name, name))
    return busy


def busy_refusal(users: list[User]) -> str | None:
    """Why the move must wait (a server of either user runs or is pending), or None."""
    busy = [label for user in users for label in busy_servers(user)]
    if not busy:
        return None
    return f"Stop these servers first, then move: {', '.join(busy)} (nothing was moved)"


class MoveUserHandler(GPUTapAPIHandler):
    """Move user ``old`` (hub user, billing account, files) to the name in ``to``."""

    async def post(self, old: str) -> None:
        if self.current_user is None:
            raise web.HTTPError(403, "Log in as an admin to move an account")
        if not has_scope("admin:users", self.parsed_scopes, db=self.db):
            raise web.HTTPError(
                403, "Moving an account needs the scope admin:users (JupyterHub admins hold it)"
            )
        to = self.json_body(("to",)).get("to")
        if not isinstance(to, str) or not to.strip():
            raise web.HTTPError(
                400, "Field 'to' is required: the user's new name (their new GitHub login)"
            )
        new = self.authenticator.normalize_username(to)
        if not self.authenticator.validate_username(new):
            raise web.HTTPError(400, f"Field 'to' is not a valid username: {shown(to)}")
        async with _moving:
            user = self.find_user(old)
            if user is None:
                raise web.HTTPError(404, f"No user {shown(old)}: nothing to move")
            if new == user.name:
                raise web.HTTPError(400, f"Field 'to': the user is already named {new}")
            answer = await self.move(user, self.find_user(new), new)
        self.write_json(answer)

    async def move(self, user: User, replaced: User | None, new: str) -> dict[str, Any]:
        old = user.name
        refusal = busy_refusal([user] + ([replaced] if replaced else []))
        if refusal:
            raise web.HTTPError(409, refusal)
        move_files = getattr(user.spawner, "move_user_files", None)
        if move_files is None:
            raise web.HTTPError(
                409,
                f"{type(user.spawner).__name__} cannot move a user's home and disks: moving "
                "accounts needs the local backend (nothing was moved)",
            )
        who = self.current_user.name
        try:
            undo_files = await move_files(old, new)
        except MoveRefused as e:
            raise web.HTTPError(409, e.message) from None
        billing: BillingClient = user.spawner.billing
        try:
            moved = await self.move_billing(billing, old, new)
        except (BillingUnavailable, BillingRefused) as e:
            await undo_files()
            if isinstance(e, BillingRefused):
                raise web.HTTPError(409, f"{e.message} (nothing was moved)") from None
            raise web.HTTPError(
                503, f"Billing is unreachable ({e}): nothing was moved; try again"
            ) from None
        try:
            await self.rename_user(user, replaced, new)
        except Exception as e:
            await self.undo_billing(billing, old, new)
            await undo_files()
            if isinstance(e, web.HTTPError):  # a server started meanwhile: said as such
                raise
            self.log.exception("Moving %s to %s: renaming the hub user failed", old, new)
            raise web.HTTPError(
                500,
                f"Renaming the hub user {old} failed: nothing was moved (the hub's log says why)",
            ) from None
        self.log.info(
            "%s moved account %s to %s%s",
            who,
            old,
            new,
            f" (replacing the empty user {new})" if replaced else "",
        )
        return {
            "from": old,
            "to": new,
            "balance": moved["account"]["balance"],
            "discarded_trial_micro": moved["discarded_trial_micro"],
            "replaced_user": replaced is not None,
        }

    @staticmethod
    async def move_billing(billing: BillingClient, old: str, new: str) -> dict[str, Any]:
        """Billing's move; an account never opened (billing was down at every login) is
        opened first, as the user's next page would."""
        try:
            return await billing.move_account(old, new)
        except BillingRefused as e:
            if e.status != 404:
                raise
        await billing.open_account(old)
        return await billing.move_account(old, new)

    async def undo_billing(self, billing: BillingClient, old: str, new: str) -> None:
        try:
            await billing.move_account(new, old)
        except (BillingUnavailable, BillingRefused) as e:
            self.log.error(
                "Moving %s to %s: the billing account is now %s's but the hub user is still "
                "%s, and moving it back failed (%s): move it back with POST "
                "api/accounts/%s/move {'to': '%s'} as a billing admin",
                old,
                new,
                new,
                old,
                e,
                new,
                old,
            )

    async def rename_user(self, user: User, replaced: User | None, new: str) -> None:
        """Delete ``replaced`` (the new login's empty user) and rename ``user`` to ``new``,
        in one commit of the hub's database; it raises only when nothing was committed."""
        if replaced is not None:
            await replaced.delete_spawners()  # no server of theirs runs: nothing to stop
        # last look, with no await until the commit: no server started meanwhile
        refusal = busy_refusal([user] + ([replaced] if replaced else []))
        if refusal:
            raise web.HTTPError(409, refusal)
        try:
            if replaced is not None:
                self.db.delete(replaced.orm_user)
                self.db.flush()  # the name is free before the rename takes it
            user.name = new
            self.db.commit()
        except Exception:
            self.db.rollback()
            raise
        try:
            await self.forget(user, replaced)
        except Exception:
            self.log.exception("Moved %s: forgetting the cached users failed", new)

    async def forget(self, user: User, replaced: User | None) -> None:
        """After the commit: drop the cached users (the renamed one keeps URLs made from its
        old name; the next lookup builds it again from the same database row) and tell the
        authenticator. ``pop``, not ``del``: UserDict's ``del`` also detaches the rows from
        the hub's database session, which the renamed user's next spawn still uses."""
        if replaced is not None:
            self.users.pop(replaced.id, None)
            TOTAL_USERS.dec()
            await maybe_future(self.authenticator.delete_user(replaced))
        self.users.pop(user.id, None)


default_handlers = [(rf"/{MOVE_PATH}/([^/]+)/move", MoveUserHandler)]
