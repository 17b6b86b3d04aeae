"""The GitHub stand-in's HTTP edge: GitHub's OAuth web flow and the REST paths the hub uses.

Paths are those of GitHub Enterprise Server (`{url}/login/oauth/...`, `{url}/api/v3/...`), so
GitHubOAuthenticator with `github_url` pointing here uses them unchanged.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from xml.sax.saxutils import escape

import tornado.web

from .state import (
    ORG_SCOPES,
    GitHubState,
    Grant,
    OAuthError,
    Org,
    Team,
    User,
    effective_scopes,
    page_bounds,
    parse_scopes,
)

log = logging.getLogger("github_sim")

DOCS = "https://docs.github.com/rest"
DEFAULT_PER_PAGE = 30
DENIED = "The user has denied your application access."
RESTRICTED = (
    "Although you appear to have the correct authorization credentials, the `{org}` "
    "organization has enabled OAuth App access restrictions, meaning that data access to "
    "third-parties is limited. For more information on these restrictions, including how to "
    "enable this app, visit "
    "https://docs.github.com/articles/restricting-access-to-your-organization-s-data/"
)
SAML = (
    "Resource protected by organization SAML enforcement. You must grant your OAuth token "
    "access to this organization."
)
FAULT_MESSAGES = {
    401: "Bad credentials",
    403: "Forbidden",
    404: "Not Found",
    429: "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
    "again.",
    500: "Server Error",
    502: "Server Error",
    503: "Service Unavailable",
}


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query += [(k, v) for k, v in params.items() if v]
    return urlunsplit(parts._replace(query=urlencode(query)))


class SimHandler(tornado.web.RequestHandler):
    def initialize(self, state: GitHubState, prefix: str = "/api/v3", web: str = "") -> None:
        self.state = state
        self.prefix = prefix  # where the REST API is: /api/v3 (Enterprise Server) or / (ghe.com)
        self.web = web  # the web flow's origin when the API has a host of its own

    def check_xsrf_cookie(self) -> None:  # GitHub's token endpoint takes cross-site POSTs
        pass

    @property
    def web_url(self) -> str:
        return self.web or f"{self.request.protocol}://{self.request.host}"

    @property
    def api_url(self) -> str:
        return f"{self.request.protocol}://{self.request.host}{self.prefix}"

    async def prepare(self) -> None:
        """Injected faults (GitHubState.fail): a delay, then GitHub's answer for the status."""
        fault = self.state.fault_for(self.request.path)
        if fault is None:
            return
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.status is None:
            return
        status, message = fault.status, FAULT_MESSAGES[fault.status]
        self.set_header("Content-Type", "application/json; charset=utf-8")
        if status == 429 or fault.rate_limited:
            reset = int(time.time()) + fault.retry_after
            self.set_header("Retry-After", str(fault.retry_after))
            self.set_header("X-RateLimit-Limit", "5000")
            self.set_header("X-RateLimit-Remaining", "0")
            self.set_header("X-RateLimit-Reset", str(reset))
            if fault.rate_limited:
                message = "API rate limit exceeded for user ID 1."
        self.set_status(status)
        self.finish(
            json.dumps({"message": message, "documentation_url": DOCS, "status": str(status)})
        )


class HomeHandler(SimHandler):
    def get(self) -> None:
        self.write(
            "<!doctype html><title>GitHub stand-in</title>"
            "<h1>GitHub stand-in (gputap tests)</h1><p>This is not GitHub.</p>"
        )


class AuthorizeHandler(SimHandler):
    """GET /login/oauth/authorize: the page where a test user is picked instead of signing
    in; `login=NAME` (the page's links) issues a code and returns to the app."""

    def get(self) -> None:
        client_id = self.get_argument("client_id", "")
        if client_id != self.state.client_id:
            self.set_status(404)
            self.finish(self._page("Unknown application", f"<p>No OAuth app {client_id!r}.</p>"))
            return
        if not self.state.callback_url:
            self.set_status(400)
            self.finish(self._page("No callback URL", "<p>This OAuth app has no callback URL.</p>"))
            return
        redirect_uri = self.get_argument("redirect_uri", "") or self.state.callback_url
        state = self.get_argument("state", "")
        if not self.state.redirect_allowed(redirect_uri):
            self.redirect(
                _with_query(
                    self.state.callback_url,
                    error="redirect_uri_mismatch",
                    error_description=OAuthError("redirect_uri_mismatch").description,
                    state=state,
                )
            )
            return
        challenge = self.get_argument("code_challenge", "")
        if challenge and self.get_argument("code_challenge_method", "") != "S256":
            self.set_status(400)
            self.finish(self._page("Bad PKCE", "<p>Only the S256 code_challenge_method.</p>"))
            return
        if self.get_argument("deny", ""):
            self.redirect(
                _with_query(
                    redirect_uri, error="access_denied", error_description=DENIED, state=state
                )
            )
            return
        login = self.get_argument("login", "")
        if login:
            if login.lower() not in self.state.users:
                self.set_status(404)
                self.finish(
                    self._page("Unknown user", f"<p>No test user {html.escape(login)}.</p>")
                )
                return
            scopes = parse_scopes(self.get_argument("scope", ""))
            code = self.state.issue_code(login, client_id, scopes, redirect_uri, challenge)
            log.info("authorized %s for %s (scopes %s)", login, client_id, ",".join(scopes))
            self.redirect(_with_query(redirect_uri, code=code, state=state))
            return
        self.finish(self._choose_page())

    def _choose_page(self) -> str:
        here = self.request.full_url()
        items = "".join(
            f'<li><a class="user" id="login-{html.escape(u.login)}" '
            f'href="{html.escape(_with_query(here, login=u.login))}">'
            f"<b>{html.escape(u.login)}</b> {html.escape(u.name or '')}</a></li>"
            for u in self.state.users.values()
        )
        scope = html.escape(self.get_argument("scope", "") or "(none)")
        body = (
            "<p class='notice'>This is a stand-in for GitHub used by gputap's tests and demo. "
            "No GitHub account is involved: pick a test user to sign in as.</p>"
            f"<p>Application <code>{html.escape(self.state.client_id)}</code> asks for "
            f"scopes: <code>{scope}</code></p>"
            f"<ul id='users'>{items or '<li>No test users are declared.</li>'}</ul>"
            f"<p><a id='deny' href='{html.escape(_with_query(here, deny='1'))}'>Cancel</a></p>"
        )
        return self._page("GitHub stand-in: choose a test user", body)

    @staticmethod
    def _page(title: str, body: str) -> str:
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            "</title></head><body style='font-family:sans-serif;max-width:40em;margin:2em auto'>"
            f"<h1>{html.escape(title)}</h1>{body}</body></html>"
        )


class AccessTokenHandler(SimHandler):
    """POST /login/oauth/access_token: code -> token. Errors answer 200 with an `error`
    body, as GitHub's do; the format follows the Accept header (JSON, XML, else form)."""

    def post(self) -> None:
        params = self._params()
        grant_type = params.get("grant_type", "authorization_code")
        try:
            if grant_type != "authorization_code":
                raise OAuthError("unsupported_grant_type")
            token, grant = self.state.exchange_code(
                params.get("client_id", ""),
                params.get("client_secret", ""),
                params.get("code", ""),
                params.get("redirect_uri", ""),
                params.get("code_verifier", ""),
            )
        except OAuthError as e:
            log.info("token request refused: %s", e.error)
            self._answer({"error": e.error, "error_description": e.description})
            return
        self._answer(
            {"access_token": token, "token_type": "bearer", "scope": ",".join(grant.scopes)}
        )

    def _params(self) -> dict[str, str]:
        params = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        content_type = self.request.headers.get("Content-Type", "")
        if content_type.startswith("application/json"):
            try:
                body = json.loads(self.request.body or b"{}")
            except ValueError:
                raise tornado.web.HTTPError(400, "body is not JSON") from None
            params.update({k: str(v) for k, v in body.items()})
        else:
            params.update({k: self.get_body_argument(k) for k in self.request.body_arguments})
        return params

    def _answer(self, body: dict[str, str]) -> None:
        accept = self.request.headers.get("Accept", "")
        if "application/json" in accept:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.finish(json.dumps(body))
        elif "xml" in accept:
            self.set_header("Content-Type", "application/xml; charset=utf-8")
            fields = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in body.items())
            self.finish(f"<OAuth>{fields}</OAuth>")
        else:
            self.set_header("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
            self.finish(urlencode(body))


class ApiHandler(SimHandler):
    """REST: JSON bodies, `Authorization: token X` or `Bearer X`, GitHub's error shapes."""

    grant: Grant | None = None

    async def prepare(self) -> None:
        self.state.requests.append((self.request.method or "GET", self.request.path))
        await super().prepare()
        if self._finished:
            return
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("X-GitHub-Media-Type", "github.v3; format=json")
        header = self.request.headers.get("Authorization", "")
        if not header:
            return
        scheme, _, token = header.partition(" ")
        self.grant = (
            self.state.grant_for(token.strip()) if scheme.lower() in ("token", "bearer") else None
        )
        if self.grant is None:
            self.fail(401, "Bad credentials")
            return
        self.set_header("X-OAuth-Scopes", ", ".join(self.grant.scopes))

    def authenticated(self) -> Grant | None:
        """The request's grant; answers 401 (and returns None) when there is none."""
        if self.grant is None:
            self.fail(401, "Requires authentication")
        return self.grant

    def fail(self, code: int, message: str) -> None:
        self.set_status(code)
        self.finish(
            json.dumps({"message": message, "documentation_url": DOCS, "status": str(code)})
        )

    def send(self, body: Any) -> None:
        self.finish(json.dumps(body))

    def refused_org(self, org_login: str) -> bool:
        """Answer GitHub's 403 when the token may not see this organization's data (OAuth
        App access restrictions, SAML SSO not authorized); True if it did."""
        org = self.state.orgs.get(org_login.lower())
        if org is None or self.grant is None:
            return False
        why = org.hidden_by(self.grant.login)
        if why == "restricted":
            self.fail(403, RESTRICTED.format(org=org.login))
        elif why == "saml":
            self.set_header(
                "X-GitHub-SSO",
                f"required; url={self.web_url}/orgs/{org.login}/sso?authorization_request="
                f"{org.id}{self.state.users[self.grant.login].id}",
            )
            self.fail(403, SAML)
        return why is not None

    def sso_partial(self, login: str) -> None:
        """GitHub's header when a list leaves out organizations for want of SSO."""
        hidden = self.state.sso_hidden_orgs(login)
        if hidden:
            ids = ",".join(str(o.id) for o in hidden)
            self.set_header("X-GitHub-SSO", f"partial-results; organizations={ids}")

    def no_content(self) -> None:
        self.set_status(204)
        self.clear_header("Content-Type")
        self.finish()

    def paginate(self, items: list[Any]) -> list[Any]:
        """One page of items by `per_page` and `page`, with GitHub's Link header."""
        try:
            per_page = int(self.get_query_argument("per_page", str(DEFAULT_PER_PAGE)))
            page = int(self.get_query_argument("page", "1"))
        except ValueError:
            per_page, page = DEFAULT_PER_PAGE, 1
        per_page = min(max(per_page, 1), self.state.max_per_page)
        page = max(page, 1)
        start, stop, last = page_bounds(len(items), per_page, page)
        if last > 1:
            here = self.web_url + self.request.uri

            def link(n: int, rel: str) -> str:
                return f'<{_with_query(here, per_page=str(per_page), page=str(n))}>; rel="{rel}"'

            links = []
            if page > 1:
                links += [link(min(page - 1, last), "prev")]
            if page < last:
                links += [link(page + 1, "next"), link(last, "last")]
            if page > 1:
                links += [link(1, "first")]
            self.set_header("Link", ", ".join(links))
        return items[start:stop]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish(
            json.dumps(
                {"message": self._reason, "documentation_url": DOCS, "status": str(status_code)}
            )
        )

    # -- shapes -------------------------------------------------------------------------

    def user_json(self, user: User, private: bool = False) -> dict[str, Any]:
        api = self.api_url
        body = {
            "login": user.login,
            "id": user.id,
            "node_id": f"U_sim{user.id}",
            "avatar_url": f"{self.web_url}/avatars/u/{user.id}",
            "gravatar_id": "",
            "url": f"{api}/users/{user.login}",
            "html_url": f"{self.web_url}/{user.login}",
            "organizations_url": f"{api}/users/{user.login}/orgs",
            "type": "User",
            "site_admin": user.site_admin,
            "name": user.name,
            "company": None,
            "blog": "",
            "location": None,
            "email": user.email,
            "hireable": None,
            "bio": None,
            "public_repos": 0,
            "public_gists": 0,
            "followers": 0,
            "following": 0,
            "created_at": "2020-01-01T00:00:00Z",
            "updated_at": "2020-01-01T00:00:00Z",
        }
        if private:
            body.update(
                {
                    "private_gists": 0,
                    "total_private_repos": 0,
                    "owned_private_repos": 0,
                    "collaborators": 0,
                    "two_factor_authentication": True,
                }
            )
        return body

    def org_json(self, org: Org) -> dict[str, Any]:
        api = f"{self.api_url}/orgs/{org.login}"
        return {
            "login": org.login,
            "id": org.id,
            "node_id": f"O_sim{org.id}",
            "url": api,
            "repos_url": f"{api}/repos",
            "events_url": f"{api}/events",
            "hooks_url": f"{api}/hooks",
            "issues_url": f"{api}/issues",
            "members_url": f"{api}/members{{/member}}",
            "public_members_url": f"{api}/public_members{{/member}}",
            "avatar_url": f"{self.web_url}/avatars/o/{org.id}",
            "description": org.name,
        }

    def team_simple_json(self, team: Team) -> dict[str, Any]:
        """GitHub's team-simple (a team's `parent`): no organization, no parent of its own."""
        org = self.state.orgs[team.org.lower()]
        api = f"{self.api_url}/organizations/{org.id}/team/{team.id}"
        return {
            "name": team.name,
            "id": team.id,
            "node_id": f"T_sim{team.id}",
            "slug": team.slug,
            "description": team.description,
            "privacy": team.privacy,
            "notification_setting": "notifications_enabled",
            "url": api,
            "html_url": f"{self.web_url}/orgs/{team.org}/teams/{team.slug}",
            "members_url": f"{api}/members{{/member}}",
            "repositories_url": f"{api}/repos",
            "permission": "pull",
        }

    def team_json(self, team: Team) -> dict[str, Any]:
        org = self.state.orgs[team.org.lower()]
        parent = org.teams[team.parent] if team.parent else None
        return {
            **self.team_simple_json(team),
            "parent": self.team_simple_json(parent) if parent else None,
            "members_count": len(team.members),
            "repos_count": 0,
            "created_at": "2020-01-01T00:00:00Z",
            "updated_at": "2020-01-01T00:00:00Z",
            "organization": self.org_json(org),
        }


class UserHandler(ApiHandler):
    def get(self) -> None:
        grant = self.authenticated()
        if grant:
            self.send(self.user_json(self.state.users[grant.login], private=True))


class EmailsHandler(ApiHandler):
    def get(self) -> None:
        grant = self.authenticated()
        if grant is None:
            return
        if "user:email" not in effective_scopes(grant.scopes):
            self.set_header("X-Accepted-OAuth-Scopes", "user, user:email")
            self.fail(404, "Not Found")
            return
        user = self.state.users[grant.login]
        self.send(
            self.paginate(
                [
                    {
                        "email": address,
                        "primary": i == 0,
                        "verified": True,
                        "visibility": "public" if address == user.email else "private",
                    }
                    for i, address in enumerate(user.emails)
                ]
            )
        )


class UserTeamsHandler(ApiHandler):
    def get(self) -> None:
        grant = self.authenticated()
        if grant is None:
            return
        if not effective_scopes(grant.scopes) & ORG_SCOPES:
            self.set_header("X-Accepted-OAuth-Scopes", "read:org, repo, user")
            self.fail(403, "Resource not accessible: the token needs the read:org scope")
            return
        teams = self.state.teams_of(grant.login)
        self.sso_partial(grant.login)
        self.send([self.team_json(t) for t in self.paginate(teams)])


class UserOrgsHandler(ApiHandler):
    def get(self) -> None:
        grant = self.authenticated()
        if grant:
            self.sso_partial(grant.login)
            self.send([self.org_json(o) for o in self.paginate(self.state.orgs_of(grant))])


class MembershipsHandler(ApiHandler):
    """GET /user/memberships/orgs[/{org}]: the user's own memberships, which OAuth App
    restrictions and SAML SSO do not hide."""

    def get(self, org_login: str | None = None) -> None:
        grant = self.authenticated()
        if grant is None:
            return
        orgs = self.state.memberships_of(grant.login)
        if org_login is not None:
            found = [o for o in orgs if o.login.lower() == org_login.lower()]
            if not found:
                self.fail(404, "Not Found")
                return
            self.send(self.membership_json(found[0], grant.login))
            return
        self.send([self.membership_json(o, grant.login) for o in self.paginate(orgs)])

    def membership_json(self, org: Org, login: str) -> dict[str, Any]:
        user = self.state.users[login]
        return {
            "url": f"{self.api_url}/orgs/{org.login}/memberships/{user.login}",
            "state": "active",
            "role": "admin" if org.members.get(login) == "admin" else "member",
            "organization_url": f"{self.api_url}/orgs/{org.login}",
            "organization": self.org_json(org),
            "user": {"login": user.login, "id": user.id, "type": "User"},
        }


class TeamHandler(ApiHandler):
    """GET /orgs/{org}/teams/{slug}: one team, with its parent."""

    def get(self, org: str, slug: str) -> None:
        grant = self.authenticated()
        if grant is None or self.refused_org(org):
            return
        team = self.state.visible_team(grant, org, slug)
        if team is None:
            self.fail(404, "Not Found")
            return
        self.send(self.team_json(team))


class OrgMemberHandler(ApiHandler):
    """GET /orgs/{org}/members/{user}: 204 member, 404 not (or not visible to the caller).
    GitHub redirects callers who cannot see private membership to public_members; the
    stand-in answers what that redirect would."""

    def get(self, org: str, login: str) -> None:
        if self.refused_org(org):
            return
        anonymous = Grant(login="", client_id="", scopes=())
        if self.state.is_org_member(self.grant or anonymous, org, login):
            self.no_content()
        else:
            self.fail(404, "User does not exist or is not a member of the organization")


class TeamMemberHandler(ApiHandler):
    """GET /orgs/{org}/teams/{slug}/members/{user}: 204 member (of the team or a team nested
    in it), 404 not (the legacy shape GitHubOAuthenticator's `org:team` check uses)."""

    def get(self, org: str, slug: str, login: str) -> None:
        grant = self.authenticated()
        if grant is None or self.refused_org(org):
            return
        team = self.state.visible_team(grant, org, slug)
        if team is not None and self.state.in_team(team, login):
            self.no_content()
        else:
            self.fail(404, "Not Found")


class TeamMembershipHandler(ApiHandler):
    """GET /orgs/{org}/teams/{slug}/memberships/{user}: 200 {state, role} or 404."""

    def get(self, org: str, slug: str, login: str) -> None:
        grant = self.authenticated()
        if grant is None or self.refused_org(org):
            return
        team = self.state.visible_team(grant, org, slug)
        if team is None or not self.state.in_team(team, login):
            self.fail(404, "Not Found")
            return
        self.send(
            {
                "url": f"{self.api_url}/organizations/{self.state.orgs[org.lower()].id}/team/"
                f"{team.id}/memberships/{login}",
                "role": team.members.get(login.lower(), "member"),
                "state": "active",
            }
        )


class NotFoundHandler(ApiHandler):
    def get(self, *_: str) -> None:
        self.fail(404, "Not Found")

    post = put = patch = delete = get


def _log_request(handler: tornado.web.RequestHandler) -> None:
    # paths only: query strings carry codes and state
    request = handler.request
    log.info("%d %s %s", handler.get_status(), request.method, request.path)


def make_apps(
    state: GitHubState, layout: str = "server", web: str = ""
) -> list[tornado.web.Application]:
    """The stand-in's applications: one ("server": the web flow and the REST API under
    /api/v3, as GitHub Enterprise Server) or two ("ghe.com": the web flow, and the REST API
    at the root of a host of its own, as api.github.com and api.SUB.ghe.com serve it; ``web``
    is the web flow's origin, for the API's html_url links)."""
    name = r"([A-Za-z0-9][A-Za-z0-9_.-]*)"
    web_routes = [
        (r"/", HomeHandler),
        (r"/login/oauth/authorize", AuthorizeHandler),
        (r"/login/oauth/access_token", AccessTokenHandler),
    ]
    api_routes = [
        ("/user", UserHandler),
        ("/user/emails", EmailsHandler),
        ("/user/teams", UserTeamsHandler),
        ("/user/orgs", UserOrgsHandler),
        ("/user/memberships/orgs", MembershipsHandler),
        (rf"/user/memberships/orgs/{name}", MembershipsHandler),
        (rf"/orgs/{name}/members/{name}", OrgMemberHandler),
        (rf"/orgs/{name}/teams/{name}", TeamHandler),
        (rf"/orgs/{name}/teams/{name}/members/{name}", TeamMemberHandler),
        (rf"/orgs/{name}/teams/{name}/memberships/{name}", TeamMembershipHandler),
        ("/(.*)", NotFoundHandler),
    ]

    def app(routes, api_prefix: str, web_origin: str = "") -> tornado.web.Application:
        kw = {"state": state, "prefix": api_prefix, "web": web_origin}
        return tornado.web.Application(
            [(path, handler, kw) for path, handler in routes], log_function=_log_request
        )

    if layout == "server":
        api = [(f"/api/v3{path}", handler) for path, handler in api_routes]
        return [app([*web_routes, *api], "/api/v3")]
    if layout == "ghe.com":
        return [app(web_routes, ""), app(api_routes, "", web)]
    raise ValueError(f"layout must be server or ghe.com, not {layout!r}")
