"""The GitHub stand-in's HTTP edge: GitHub's OAuth web flow and the REST paths the hub uses.

Paths are those of GitHub Enterprise Server (`{url}/login/oauth/...`, `{url}/api/v3/...`), so
GitHubOAuthenticator with `github_url` pointing here uses them unchanged.
"""

from __future__ import annotations

import html
import json
import logging
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


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query += [(k, v) for k, v in params.items() if v]
    return urlunsplit(parts._replace(query=urlencode(query)))


class SimHandler(tornado.web.RequestHandler):
    def initialize(self, state: GitHubState) -> None:
        self.state = state

    def check_xsrf_cookie(self) -> None:  # GitHub's token endpoint takes cross-site POSTs
        pass

    @property
    def web_url(self) -> str:
        return f"{self.request.protocol}://{self.request.host}"

    @property
    def api_url(self) -> str:
        return f"{self.web_url}/api/v3"


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
        redirect_uri = self.get_argument("redirect_uri", "") or self.state.callback_url
        state = self.get_argument("state", "")
        if not redirect_uri:
            self.set_status(400)
            self.finish(self._page("No redirect_uri", "<p>The app sent no redirect_uri.</p>"))
            return
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

    def prepare(self) -> None:
        self.state.requests.append((self.request.method or "GET", self.request.path))
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

    def team_json(self, team: Team) -> dict[str, Any]:
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
            "parent": None,
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
        self.send([self.team_json(t) for t in self.paginate(teams)])


class UserOrgsHandler(ApiHandler):
    def get(self) -> None:
        grant = self.authenticated()
        if grant:
            self.send([self.org_json(o) for o in self.paginate(self.state.orgs_of(grant))])


class OrgMemberHandler(ApiHandler):
    """GET /orgs/{org}/members/{user}: 204 member, 404 not (or not visible to the caller).
    GitHub redirects callers who cannot see private membership to public_members; the
    stand-in answers what that redirect would."""

    def get(self, org: str, login: str) -> None:
        anonymous = Grant(login="", client_id="", scopes=())
        if self.state.is_org_member(self.grant or anonymous, org, login):
            self.no_content()
        else:
            self.fail(404, "User does not exist or is not a member of the organization")


class TeamMemberHandler(ApiHandler):
    """GET /orgs/{org}/teams/{slug}/members/{user}: 204 member, 404 not (the legacy shape
    GitHubOAuthenticator's `org:team` check uses)."""

    def get(self, org: str, slug: str, login: str) -> None:
        grant = self.authenticated()
        if grant is None:
            return
        team = self.state.visible_team(grant, org, slug)
        if team is not None and login.lower() in team.members:
            self.no_content()
        else:
            self.fail(404, "Not Found")


class TeamMembershipHandler(ApiHandler):
    """GET /orgs/{org}/teams/{slug}/memberships/{user}: 200 {state, role} or 404."""

    def get(self, org: str, slug: str, login: str) -> None:
        grant = self.authenticated()
        if grant is None:
            return
        team = self.state.visible_team(grant, org, slug)
        if team is None or login.lower() not in team.members:
            self.fail(404, "Not Found")
            return
        self.send(
            {
                "url": f"{self.api_url}/organizations/{self.state.orgs[org.lower()].id}/team/"
                f"{team.id}/memberships/{login}",
                "role": team.members[login.lower()],
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


def make_app(state: GitHubState) -> tornado.web.Application:
    kw = {"state": state}
    name = r"([A-Za-z0-9][A-Za-z0-9-]*)"
    return tornado.web.Application(
        [
            (r"/", HomeHandler, kw),
            (r"/login/oauth/authorize", AuthorizeHandler, kw),
            (r"/login/oauth/access_token", AccessTokenHandler, kw),
            (r"/api/v3/user", UserHandler, kw),
            (r"/api/v3/user/emails", EmailsHandler, kw),
            (r"/api/v3/user/teams", UserTeamsHandler, kw),
            (r"/api/v3/user/orgs", UserOrgsHandler, kw),
            (rf"/api/v3/orgs/{name}/members/{name}", OrgMemberHandler, kw),
            (rf"/api/v3/orgs/{name}/teams/{name}/members/{name}", TeamMemberHandler, kw),
            (rf"/api/v3/orgs/{name}/teams/{name}/memberships/{name}", TeamMembershipHandler, kw),
            (r"/api/v3/(.*)", NotFoundHandler, kw),
        ],
        log_function=_log_request,
    )
