"""Accounts: open one (the hub, at login), read one's balance, pools, open sessions and
warnings, list them all, read an account's ledger, and move one to another username (a
renamed login)."""

from __future__ import annotations

import functools
import logging

from tornado import web

from gputap_common.money import format_credits

from .base import APIHandler
from .fields import MAX_LENGTH, check_text, text_field
from .views import transaction_view

log = logging.getLogger("billing")


class AccountHandler(APIHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        now = self.now()
        state = await self.blocking(self.store.account, username, now)
        self.write_json(self.account_json(state, now))

    @web.authenticated
    async def put(self, username: str) -> None:
        self.require_hub()
        check_text(username, "username", MAX_LENGTH["username"])
        groups = self.body(("groups",)).get("groups", []) if self.request.body else []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise web.HTTPError(400, "groups must be a list of the user's group names")
        now = self.now()
        state, created = await self.blocking(self.store.open_account, username, now)
        if created:
            log.info("Opened billing account %s with trial credit", username)
        joined = await self.blocking(self.store.enroll_by_groups, username, groups, now)
        if joined:
            log.info("%s joined %s through their GitHub teams", username, ", ".join(joined))
        self.write_saved(self.account_json(state, now), created)


class AccountsHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        if not self.sees_everyone:
            raise web.HTTPError(403, "Only billing admins may list every account")
        now = self.now()
        view = functools.partial(self.account_json, now=now)
        await self.write_records("accounts", view, self.store.accounts, now)


class MeHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        if not self.caller_is_user:
            raise web.HTTPError(
                400, "api/me is for users; services read GET api/accounts/{username}"
            )
        now = self.now()
        state, _ = await self.blocking(self.store.open_account, self.caller, now)
        self.write_json(self.account_json(state, now))


class TransactionsHandler(APIHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        await self.write_records(
            "transactions", transaction_view, self.store.transactions, username
        )


class MoveHandler(APIHandler):
    """``POST api/accounts/{old}/move`` ``{"to": new}``: the account with all its history
    (balance, ledger, sessions, courses) now belongs to the username ``new``; ``new``'s own
    untouched trial account is discarded. The hub's move (docs/github.md, "Renamed logins")
    calls this between moving the files and renaming the hub user; billing admins may call
    it too, but only the hub renames the hub user and moves the files."""

    @web.authenticated
    async def post(self, old: str) -> None:
        if not (self.is_hub or self.is_admin):
            self.require_admin()
        new = text_field(self.body(("to",)), "to")
        check_text(new, "to", MAX_LENGTH["username"])
        moved = await self.blocking(self.store.move_account, old, new, self.now())
        discarded = moved.discarded_trial_micro
        log.info(
            "Moved billing account %s to %s for %s%s",
            old,
            new,
            self.caller,
            f" (discarded {new}'s untouched trial of {format_credits(discarded)})"
            if discarded is not None
            else "",
        )
        self.write_json(
            {
                "from": old,
                "account": self.account_json(moved.state, self.now()),
                "discarded_trial_micro": discarded,
            }
        )


default_handlers = [
    (r"api/accounts", AccountsHandler),
    (r"api/accounts/([^/]+)", AccountHandler),
    (r"api/accounts/([^/]+)/transactions", TransactionsHandler),
    (r"api/accounts/([^/]+)/move", MoveHandler),
    (r"api/me", MeHandler),
]
