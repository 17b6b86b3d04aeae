"""Accounts: open one (the hub, at login), read one's balance, pools, open sessions and
warnings, list them all, and read an account's ledger."""

from __future__ import annotations

import functools
import logging

from tornado import web

from .base import APIHandler
from .fields import MAX_LENGTH, check_text
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


default_handlers = [
    (r"api/accounts", AccountsHandler),
    (r"api/accounts/([^/]+)", AccountHandler),
    (r"api/accounts/([^/]+)/transactions", TransactionsHandler),
    (r"api/me", MeHandler),
]
