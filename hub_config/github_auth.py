"""gputap's GitHub authenticator: oauthenticator's GitHubOAuthenticator, as GitHub behaves.

- Every failing GitHub call becomes a :class:`~hub_config.github_errors.GitHubError`: the
  login page says GitHub did not answer (503, retry) or refused (403, why), never a bare 500.
- The ``allowed_organizations`` check tells "not a member" (404) from SAML SSO, an
  organization that has not approved the app, rate limits and outages.
- Refresh re-reads teams and re-checks membership; while GitHub cannot be asked, the user
  keeps their last good state for ``refresh_grace_seconds``; only a revoked token (401) or a
  real "not a member" ends the session.
- Groups hold a user's direct teams and every ancestor of them (GitHub counts a child team's
  members as members of its parents).
- Organizations GitHub hides from gputap (OAuth-app restriction, SAML) are kept in auth_state
  ``gputap_hidden_orgs``, warned about, and told to the user on hub pages.
- An account belongs to a GitHub user id: a login now held by another GitHub account is
  refused.

See docs/github.md.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

from jupyterhub.handlers import BaseHandler
from oauthenticator.github import GitHubOAuthenticator
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Integer, Set

from gputap_common import clock

from . import github_members
from .github_errors import GitHubError, classify, unavailable
from .origins import hub_host_only

NOTICES_PATH = "gputap/github-notices"
CHECKED_AT = "gputap_checked_at"  # auth_state: when GitHub last answered for this user
HIDDEN_ORGS = "gputap_hidden_orgs"  # auth_state: [{org, why, sso_url}]
PARENT_TEAMS = "gputap_parent_teams"  # auth_state: ancestors of the user's direct teams


def _what(url: str) -> str:
    """What a GitHub call asks, in words for the login page."""
    path = url.split("?", 1)[0]
    for end, words in (
        ("/login/oauth/access_token", "a sign-in token"),
        ("/user", "who you are"),
        ("/user/emails", "your email address"),
        ("/user/teams", "your teams"),
        ("/user/orgs", "your organizations"),
        ("/user/memberships/orgs", "your organization memberships"),
    ):
        if path.endswith(end):
            return words
    if "/teams/" in path:
        return "a team of your organization"
    return "your account"


def hidden_org_notice(hidden: dict[str, str], github_url: str, client_id: str) -> dict[str, str]:
    """The hub-page banner's words for one organization GitHub hides from gputap."""
    org = hidden["org"]
    if hidden["why"] == "saml":
        return {
            "org": org,
            "text": (
                f"gputap cannot see your teams in {org}: the organization requires SAML single "
                f"sign-on. Authorize gputap for {org} on GitHub, then sign in again."
            ),
            "link": hidden.get("sso_url") or f"{github_url}/settings/applications",
            "link_text": f"Authorize gputap for {org}",
        }
    return {
        "org": org,
        "text": (
            f"gputap cannot see your teams in {org}: the organization has not approved "
            f"gputap's GitHub app. Ask an owner of {org} to approve it, then sign in again."
        ),
        "link": f"{github_url}/settings/connections/applications/{client_id}",
        "link_text": f"Request approval from {org}",
    }


class GitHubNoticesHandler(BaseHandler):
    """GET /hub/gputap/github-notices: the signed-in user's banner notices (JSON), read from
    their auth_state: organizations named in gputap's settings that GitHub hides."""

    @web.authenticated
    async def get(self) -> None:
        user = self.current_user
        state = await user.get_auth_state() if user.kind == "user" else None
        auth = self.authenticator
        notices = [
            hidden_org_notice(h, auth.github_url, auth.client_id)
            for h in (state or {}).get(HIDDEN_ORGS) or []
            if h["org"].lower() in auth.watched_organizations
        ]
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"notices": notices}))


class GPUTapGitHubOAuthenticator(GitHubOAuthenticator):
    """GitHubOAuthenticator that tells GitHub's failures and restrictions apart."""

    refresh_grace_seconds = Integer(
        3600,
        min=0,
        config=True,
        help="""How long a user keeps their last good auth state (teams, admin) while GitHub
        cannot be asked at a refresh (down, slow, rate-limited). After it, a new login is
        needed. A revoked token or a "not a member" answer ends the session at once.

            c.GPUTapGitHubOAuthenticator.refresh_grace_seconds = 3600
        """,
    )
    watched_organizations = Set(
        config=True,
        help="""Organizations (lower case) gputap's settings name (allowed_organizations,
        admin_teams, courses.instructor_teams): when GitHub hides one of them from a user,
        the operator's log gets a WARNING and the user a banner.

            c.GPUTapGitHubOAuthenticator.watched_organizations = {"acme"}
        """,
    )

    def get_handlers(self, app: Any) -> list[tuple[str, Any]]:
        # login and callback answer only on the hub's host (hub_config/origins.py)
        return [
            *hub_host_only(super().get_handlers(app)),
            (rf"/{NOTICES_PATH}", GitHubNoticesHandler),
            (rf"/{github_members.PATH}", github_members.MembershipHandler),
        ]

    # -- every GitHub call ---------------------------------------------------------------

    async def fetch(self, req, label="fetching", parse_json=True, **kwargs):
        """oauthenticator's fetch, with failures as GitHubError (what the page tells)."""
        what = _what(req.url)
        try:
            return await super().fetch(req, label=label, parse_json=parse_json, **kwargs)
        except HTTPClientError as e:
            if e.response is None or e.code == 599:
                raise unavailable(what, str(e)) from None
            response = e.response
            failure = classify(e.code, response.headers, response.body, what, clock.utcnow())
            raise failure or unavailable(what, f"it answered {e.code}") from None
        except OSError as e:  # connection refused, DNS
            raise unavailable(what, str(e) or type(e).__name__) from None

    # -- login ---------------------------------------------------------------------------

    async def authenticate(self, handler, data=None, **kwargs):
        try:
            model = await super().authenticate(handler, data, **kwargs)
        except GitHubError as e:
            self.log.warning("GitHub login failed at GitHub: %s", e.jupyterhub_message)
            raise
        await self._refuse_another_account(handler, model)
        model["auth_state"][CHECKED_AT] = clock.utcnow().isoformat()
        return model

    async def _refuse_another_account(self, handler, model: dict[str, Any]) -> None:
        """403 when the hub user of this login belongs to another GitHub account (GitHub
        frees a login when its owner renames theirs)."""
        user = handler.find_user(model["name"])
        if user is None:
            return
        stored = await user.get_auth_state() or {}
        known = (stored.get(self.user_auth_state_key) or {}).get("id")
        arriving = model["auth_state"][self.user_auth_state_key]["id"]
        if known is None or known == arriving:
            return
        self.log.warning(
            "refused GitHub login %s: GitHub account id %s, the hub's %s belongs to id %s",
            model["name"],
            arriving,
            model["name"],
            known,
        )
        raise web.HTTPError(
            403,
            f"The GitHub login {model['name']} now belongs to a different GitHub account than "
            f"the one this hub knows as {model['name']}: GitHub gives a login to someone else "
            "once its owner renames their account. If you renamed your GitHub account, sign "
            "in with your new login and ask an admin of this hub to move your account to it. "
            f"If you have just taken the login {model['name']} on GitHub, ask an admin of this "
            "hub for an account; nothing was created for you. (docs/github.md, Renamed "
            "logins)",
            reason="This GitHub login belongs to someone else now",
        )

    async def check_allowed(self, username, auth_model):
        """oauthenticator's rules, then allowed_organizations with each answer told apart:
        204 member, 404 not; a failure that says nothing about membership raises."""
        if auth_model is None or await super(GitHubOAuthenticator, self).check_allowed(
            username, auth_model
        ):
            return True
        if not self.allowed_organizations:
            return False
        token = auth_model["auth_state"]["token_response"]
        failures: list[GitHubError] = []
        for org_team in sorted(self.allowed_organizations):
            try:
                if await self._is_member(org_team, username, token):
                    return True
            except GitHubError as e:
                failures.append(e)
        if failures:
            # an outage first: asked again, the answer may well be yes
            failures.sort(key=lambda e: not e.transient)
            raise failures[0]
        self.log.warning("%s is not a member of %s", username, sorted(self.allowed_organizations))
        return False

    async def _is_member(self, org_team: str, username: str, token: dict[str, Any]) -> bool:
        org, _, team = org_team.partition(":")
        path = (
            f"/orgs/{org}/teams/{team}/members/{username}"
            if team
            else f"/orgs/{org}/members/{username}"
        )
        response = await self._answer(path, "checking membership", token)
        if response.code == 204:
            return True
        if response.code == 404:
            return False
        what = f"whether you are a member of {org_team}"
        failure = classify(
            response.code, response.headers, response.body, what, clock.utcnow(), org=org
        ) or unavailable(what, f"it answered {response.code}")
        if not failure.transient and not await self._in_org(org, token):
            # an organization that hides its data (SSO, app policy) from everyone: it says
            # nothing about those who are not in it, and the user's own membership list does
            return False
        raise failure

    async def _in_org(self, org: str, token: dict[str, Any]) -> bool:
        """GET /user/memberships/orgs/{org}: the user's own membership, which GitHub tells
        even when the organization hides its data from the app."""
        response = await self._answer(
            f"/user/memberships/orgs/{org}", "checking the user's own membership", token
        )
        if response.code == 404:
            return False
        if response.code == 200:
            return json.loads(response.body or b"{}").get("state") == "active"
        raise classify(
            response.code,
            response.headers,
            response.body,
            f"your membership of {org}",
            clock.utcnow(),
            org=org,
        ) or unavailable(f"your membership of {org}", f"it answered {response.code}")

    # -- teams and hidden organizations --------------------------------------------------

    async def update_auth_model(self, auth_model):
        auth_model = await super().update_auth_model(auth_model)
        state = auth_model["auth_state"]
        token = state["token_response"]
        state[PARENT_TEAMS] = await self._parent_teams(state.get("teams") or [], token)
        login = state[self.user_auth_state_key]["login"]
        state[HIDDEN_ORGS] = await self._hidden_orgs(login, token)
        for hidden in state[HIDDEN_ORGS]:
            watched = hidden["org"].lower() in self.watched_organizations
            (self.log.warning if watched else self.log.info)(
                "GitHub hides organization %s from gputap for %s (%s): %s",
                hidden["org"],
                login,
                hidden["why"],
                "its members must authorize the app for SAML SSO"
                if hidden["why"] == "saml"
                else f"an owner of {hidden['org']} must approve the OAuth app {self.client_id} "
                "(organization Settings, Third-party access, OAuth app policy)",
            )
        return auth_model

    async def _get(self, url: str, token: dict[str, Any]) -> Any:
        return await self.httpfetch(
            url,
            "fetching from GitHub",
            method="GET",
            headers=self.build_userdata_request_headers(token["access_token"], token["token_type"]),
            validate_cert=self.validate_server_cert,
        )

    async def _answer(self, path: str, label: str, token: dict[str, Any]) -> Any:
        """GitHub's answer to ``GET {api}{path}`` whatever its status (the caller reads it);
        only a GitHub that does not answer raises."""
        return await self.httpfetch(
            f"{self.github_api}{path}",
            label,
            parse_json=False,
            raise_error=False,
            method="GET",
            headers=self.build_userdata_request_headers(token["access_token"], token["token_type"]),
            validate_cert=self.validate_server_cert,
        )

    async def _parent_teams(
        self, teams: list[dict[str, Any]], token: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Every ancestor of the user's direct teams (GET /orgs/{org}/teams/{slug} up the
        ``parent`` chain), each asked once per login."""

        def key(org: str, slug: str) -> tuple[str, str]:
            return org.lower(), slug.lower()

        seen = {key(t["organization"]["login"], t["slug"]) for t in teams}
        parents: list[dict[str, Any]] = []
        for team in teams:
            org = team["organization"]["login"]
            parent = team.get("parent")
            while parent and key(org, parent["slug"]) not in seen:
                seen.add(key(org, parent["slug"]))
                full = await self._get(
                    f"{self.github_api}/orgs/{org}/teams/{parent['slug']}", token
                )
                parents.append(full)
                parent = full.get("parent")
        return parents

    async def _hidden_orgs(self, login: str, token: dict[str, Any]) -> list[dict[str, str]]:
        """Organizations the user is an active member of (GET /user/memberships/orgs) that
        GitHub leaves out of GET /user/orgs for gputap, and why (saml, oauth_app, unknown)."""
        access, kind = token["access_token"], token["token_type"]
        memberships = await self._paginated_fetch(
            f"{self.github_api}/user/memberships/orgs?state=active&per_page=100", access, kind
        )
        visible = {
            o["login"].lower()
            for o in await self._paginated_fetch(
                f"{self.github_api}/user/orgs?per_page=100", access, kind
            )
        }
        hidden = []
        for membership in memberships:
            org = membership["organization"]["login"]
            if membership.get("state") != "active" or org.lower() in visible:
                continue
            # asking the org says why: 403 with X-GitHub-SSO, or the app-restriction message
            response = await self._answer(
                f"/orgs/{org}/members/{login}", "asking why an organization is hidden", token
            )
            failure = classify(
                response.code, response.headers, response.body, "", clock.utcnow(), org=org
            )
            why = {"saml": "saml", "app_restricted": "oauth_app"}.get(
                failure.kind if failure else "", "unknown"
            )
            hidden.append({"org": org, "why": why, "sso_url": failure.url if failure else ""})
        return hidden

    # -- refresh -------------------------------------------------------------------------

    async def refresh_user(self, user, handler=None, **kwargs):
        """Teams and membership asked again; never raises. Returns the new auth model, True
        (keep the last good state: GitHub could not be asked, within the grace) or False
        (a new login is needed), and True instead of False where the request cannot be sent
        to a login (:func:`asks_no_login`)."""
        model = await self._refreshed(user, handler, **kwargs)
        if model is False and asks_no_login(self, user, handler):
            self.log.warning(
                "%s needs a new login; kept for this API or another user's request", user.name
            )
            # as JupyterHub 6, which does not count this as a refresh: the user's next own
            # request is refreshed (and sent to log in) however soon it comes. The hub notes
            # the refresh right after this returns, before the loop runs anything else.
            asyncio.get_running_loop().call_soon(setattr, user, "_auth_refreshed", None)
            return True
        return model

    async def membership_lost(self, user) -> bool:
        """Whether GitHub answers that ``user`` is no longer a member of
        ``allowed_organizations`` (their servers stop: github_members.py). An outage, a rate
        limit or a revoked token says nothing about membership: False."""
        if not self.allowed_organizations:
            return False
        try:
            model = await super().refresh_user(user, None)
            if not model or model is True:
                return False
            return not await self.check_allowed(user.name, model)
        except Exception as e:  # GitHub could not say
            self.log.info("membership of %s not known this round: %s", user.name, e)
            return False

    async def _refreshed(self, user, handler, **kwargs):
        """The refresh itself, answered as :meth:`refresh_user` says, for any request."""
        try:
            model = await super().refresh_user(user, handler, **kwargs)
            if model and model is not True:
                if not await self.check_allowed(user.name, model):
                    self.log.warning(
                        "%s is no longer a member of %s: signed out",
                        user.name,
                        sorted(self.allowed_organizations),
                    )
                    return False
                model["auth_state"][CHECKED_AT] = clock.utcnow().isoformat()
            return model
        except GitHubError as e:
            if e.kind == "token_revoked":
                self.log.warning("GitHub revoked %s's token: a new login is needed", user.name)
                return False
            return await self._keep_last_good(user, e.jupyterhub_message)
        except Exception as e:  # never let a refresh turn a server's own call into an error
            self.log.exception("refreshing %s failed", user.name)
            return await self._keep_last_good(user, repr(e))

    async def _keep_last_good(self, user, why: str) -> bool:
        state = await user.get_auth_state() or {}
        try:
            checked = datetime.fromisoformat(state[CHECKED_AT])
        except (KeyError, TypeError, ValueError):
            checked = None
        grace = timedelta(seconds=self.refresh_grace_seconds)
        now = clock.utcnow()
        if checked is None or now - checked > grace:
            self.log.warning(
                "GitHub could not be asked refreshing %s and the last good answer is older "
                "than %s s: a new login is needed (%s)",
                user.name,
                self.refresh_grace_seconds,
                why,
            )
            return False
        self.log.warning(
            "GitHub could not be asked refreshing %s: keeping the state of %s until %s (%s)",
            user.name,
            f"{checked:%H:%M:%S}",
            f"{checked + grace:%H:%M:%S} UTC",
            why,
        )
        return True


def asks_no_login(authenticator: Any, user: Any, handler: Any) -> bool:
    """Whether a refresh that needs a new login must keep the stale state for this request.

    Only the user's own browser can be sent to log in. For a token (a server's or the
    user's API call) or another user's request, JupyterHub 6 keeps the stale state unless
    ``auth_refresh_strict`` (``refresh_auth`` in jupyterhub/handlers/base.py, 6.0); JupyterHub 5
    answered them 403, so on 5.5.0, the chart's hub, a GitHub outage past the grace cut running
    servers off the hub API. The same attributes JupyterHub 6 reads decide it here; JupyterHub
    5 sets the requester only after refreshing them, so none yet is the user's own request."""
    if handler is None or getattr(authenticator, "auth_refresh_strict", False):
        return False
    token = getattr(handler, "_token_authenticated", False)
    return token or getattr(handler, "_jupyterhub_user", user) is not user
