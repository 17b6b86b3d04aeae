"""What the GitHub stand-in knows: users, organizations, teams, OAuth codes and tokens (pure).

Names are case-insensitive, as on GitHub: every mapping is keyed by the lower-case name and
the objects keep the case they were declared with.

Visibility follows GitHub's rules as far as the hub depends on them: private organization
membership and teams are seen only by members whose token carries `read:org`; a secret team
only by its members and the organization's owners; `/user/emails` needs `user:email`.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

CODE_LIFETIME_SECONDS = 600  # GitHub's authorization codes expire after ten minutes
# a loopback callback: GitHub lets a loopback redirect_uri use any port (docs: "Loopback
# redirect urls"), so every test hub on 127.0.0.1 matches it
DEFAULT_CALLBACK = "http://127.0.0.1/hub/oauth_callback"
LOOPBACK = ("127.0.0.1", "::1", "[::1]")
# scopes that include others (GitHub's scope hierarchy, the parts the stand-in checks)
IMPLIED_SCOPES = {
    "admin:org": {"write:org", "read:org"},
    "write:org": {"read:org"},
    "user": {"read:user", "user:email", "user:follow"},
}
ORG_SCOPES = {"read:org", "write:org", "admin:org", "user", "repo"}


class SimError(ValueError):
    """A declaration the stand-in cannot hold (unknown user, duplicate team...)."""


class OAuthError(Exception):
    """A token request GitHub refuses; `error` is GitHub's code, `description` its words."""

    DESCRIPTIONS = {
        "incorrect_client_credentials": "The client_id and/or client_secret passed are incorrect.",
        "redirect_uri_mismatch": (
            "The redirect_uri MUST match the registered callback URL for this application."
        ),
        "bad_verification_code": "The code passed is incorrect or expired.",
        "unsupported_grant_type": "The grant type is not supported.",
    }

    def __init__(self, error: str, description: str | None = None):
        super().__init__(error)
        self.error = error
        self.description = description or self.DESCRIPTIONS[error]


@dataclass
class User:
    login: str
    id: int
    name: str | None = None
    email: str | None = None  # the public email; None: kept private
    emails: list[str] = field(default_factory=list)  # all verified emails, primary first
    site_admin: bool = False


@dataclass
class Team:
    org: str
    slug: str
    id: int
    name: str
    description: str = ""
    privacy: str = "closed"  # closed: visible to the organization; secret: to its members
    members: dict[str, str] = field(default_factory=dict)  # lower login -> member | maintainer
    parent: str | None = None  # lower slug of the parent team, in the same organization


@dataclass
class Org:
    login: str
    id: int
    name: str | None = None
    members: dict[str, str] = field(default_factory=dict)  # lower login -> member | admin
    public_members: set[str] = field(default_factory=set)  # lower logins
    teams: dict[str, Team] = field(default_factory=dict)  # lower slug -> team
    restricts_apps: bool = False  # OAuth App access restrictions on (GitHub's default for new orgs)
    app_approved: bool = False  # an owner approved the app despite them
    saml: bool = False  # SAML SSO enforced: a token needs authorizing for the org
    sso_authorized: set[str] = field(default_factory=set)  # lower logins whose token is

    def hidden_by(self, login: str) -> str | None:
        """Why this organization's data is kept from a token of ``login``: "restricted"
        (OAuth App access restrictions, app not approved), "saml" (not authorized for SSO)."""
        if self.restricts_apps and not self.app_approved:
            return "restricted"
        if self.saml and login not in self.sso_authorized:
            return "saml"
        return None


@dataclass
class Fault:
    """Requests to ``path`` (exact, or a glob) answered ``status`` (None: answered normally),
    after ``delay`` seconds, ``times`` times (None: until cleared)."""

    path: str
    status: int | None
    times: int | None = None
    retry_after: int = 60
    delay: float = 0.0
    rate_limited: bool = False


@dataclass
class Grant:
    """An issued authorization code or access token."""

    login: str  # lower case (follows a rename)
    client_id: str
    scopes: tuple[str, ...]
    redirect_uri: str = ""
    code_challenge: str = ""
    expires_at: float = 0.0


def parse_scopes(raw: str) -> tuple[str, ...]:
    """Scopes as GitHub reads them from an authorize request: space or comma separated."""
    seen: list[str] = []
    for scope in raw.replace(",", " ").split():
        if scope not in seen:
            seen.append(scope)
    return tuple(seen)


def effective_scopes(scopes: tuple[str, ...]) -> set[str]:
    result = set(scopes)
    for scope in scopes:
        result |= IMPLIED_SCOPES.get(scope, set())
    return result


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def page_bounds(total: int, per_page: int, page: int) -> tuple[int, int, int]:
    """(start, stop, last_page) of one page of `total` items; pages count from 1."""
    last = max(1, -(-total // per_page))
    start = (page - 1) * per_page
    return start, min(start + per_page, total), last


class GitHubState:
    """Users, organizations and teams, and the OAuth grants issued over them.

    All methods take a lock: tests declare users from their own thread while the server
    answers from its loop.
    """

    def __init__(
        self,
        client_id: str = "gputap-test-client",
        client_secret: str = "gputap-test-secret",
        callback_url: str = DEFAULT_CALLBACK,
        max_per_page: int = 100,
        clock=time.monotonic,
    ):
        self.client_id = client_id
        self.client_secret = client_secret
        self.callback_url = callback_url  # the app's one registered callback; empty: none
        self.max_per_page = max_per_page  # GitHub's cap is 100
        self.clock = clock
        self.users: dict[str, User] = {}
        self.orgs: dict[str, Org] = {}
        self.codes: dict[str, Grant] = {}
        self.tokens: dict[str, Grant] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every API call, in order
        self.faults: list[Fault] = []
        self._ids = iter(range(1001, 10**9))
        self._lock = threading.RLock()

    # -- declarations -------------------------------------------------------------------

    def add_user(
        self,
        login: str,
        name: str | None = None,
        email: str | None = None,
        emails: list[str] | None = None,
        site_admin: bool = False,
    ) -> User:
        """Declare a GitHub account. `email` is the public email (None keeps it private);
        `emails` the verified addresses /user/emails lists (default: `email` or
        `{login}@users.noreply.github.com`)."""
        with self._lock:
            if login.lower() in self.users:
                raise SimError(f"user {login} already exists")
            addresses = list(emails or [email or f"{login}@users.noreply.github.com"])
            user = User(login, next(self._ids), name, email, addresses, site_admin)
            self.users[login.lower()] = user
            return user

    def add_org(
        self,
        login: str,
        members: list[str] | None = None,
        admins: list[str] | None = None,
        public_members: list[str] | None = None,
        name: str | None = None,
        restricts_apps: bool = False,
        saml: bool = False,
    ) -> Org:
        """Declare an organization; `admins` are its owners, `public_members` made their
        membership public (everyone sees it, with or without `read:org`); `restricts_apps`:
        OAuth App access restrictions on, the app not approved; `saml`: SSO enforced."""
        with self._lock:
            if login.lower() in self.orgs:
                raise SimError(f"organization {login} already exists")
            org = Org(login, next(self._ids), name, restricts_apps=restricts_apps, saml=saml)
            self.orgs[login.lower()] = org
            for user in members or []:
                self.add_member(login, user)
            for user in admins or []:
                self.add_member(login, user, role="admin")
            for user in public_members or []:
                self.add_member(login, user, public=True)
            return org

    def add_member(self, org: str, login: str, role: str = "member", public: bool = False):
        with self._lock:
            o = self._org(org)
            key = self._user(login).login.lower()
            if role not in ("member", "admin"):
                raise SimError(f"organization role must be member or admin, not {role!r}")
            if o.members.get(key) != "admin":
                o.members[key] = role
            if public:
                o.public_members.add(key)

    def add_team(
        self,
        org: str,
        slug: str,
        members: list[str] | None = None,
        maintainers: list[str] | None = None,
        name: str | None = None,
        privacy: str = "closed",
        description: str = "",
        parent: str | None = None,
    ) -> Team:
        """Declare a team of an organization; its members join the organization too.
        `parent`: the slug of its parent team (GitHub's nested teams)."""
        with self._lock:
            o = self._org(org)
            if slug.lower() in o.teams:
                raise SimError(f"team {org}:{slug} already exists")
            if privacy not in ("closed", "secret"):
                raise SimError(f"team privacy must be closed or secret, not {privacy!r}")
            if parent is not None and parent.lower() not in o.teams:
                raise SimError(f"no parent team {org}:{parent}; add it first")
            if parent is not None and privacy == "secret":
                raise SimError("a secret team cannot be nested (GitHub: only closed teams)")
            team = Team(o.login, slug, next(self._ids), name or slug, description, privacy)
            team.parent = parent.lower() if parent else None
            o.teams[slug.lower()] = team
            for role, logins in (("member", members), ("maintainer", maintainers)):
                for login in logins or []:
                    self.add_member(org, login)
                    team.members[login.lower()] = role
            return team

    def restrict_apps(self, org: str) -> None:
        """Turn OAuth App access restrictions on (the app is no longer approved)."""
        with self._lock:
            o = self._org(org)
            o.restricts_apps, o.app_approved = True, False

    def approve_app(self, org: str) -> None:
        """An owner of ``org`` approves the app: its tokens see the organization's data."""
        with self._lock:
            self._org(org).app_approved = True

    def require_saml(self, org: str) -> None:
        with self._lock:
            self._org(org).saml = True

    def authorize_sso(self, login: str, org: str) -> None:
        """``login`` authorized their token for ``org``'s SAML SSO."""
        with self._lock:
            self._org(org).sso_authorized.add(self._user(login).login.lower())

    def rename_user(self, old: str, new: str) -> User:
        """GitHub's rename: the same account (id, tokens, memberships) under a new login; the
        old login is free for anyone."""
        with self._lock:
            user = self._user(old)
            if new.lower() in self.users and new.lower() != old.lower():
                raise SimError(f"login {new} is taken")
            was, now = user.login.lower(), new.lower()
            del self.users[was]
            user.login = new
            self.users[now] = user
            for org in self.orgs.values():
                if was in org.members:
                    org.members[now] = org.members.pop(was)
                for group in (org.public_members, org.sso_authorized):
                    if was in group:
                        group.discard(was)
                        group.add(now)
                for team in org.teams.values():
                    if was in team.members:
                        team.members[now] = team.members.pop(was)
            for grant in (*self.codes.values(), *self.tokens.values()):
                if grant.login == was:
                    grant.login = now
            return user

    def fail(self, path: str, status: int | None, **kwargs: Any) -> Fault:
        """Answer requests to ``path`` (exact or glob) with ``status``: see :class:`Fault`."""
        if status not in (None, 401, 403, 404, 429, 500, 502, 503):
            raise SimError(f"fault status {status} is not one GitHub answers here")
        with self._lock:
            fault = Fault(path, status, **kwargs)
            self.faults.append(fault)
            return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def fault_for(self, path: str) -> Fault | None:
        """The fault that applies to this request (counting it), or None."""
        with self._lock:
            for fault in self.faults:
                if fault.path == path or fnmatch.fnmatchcase(path, fault.path):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self.faults.remove(fault)
                    return fault
            return None

    def load(self, spec: dict[str, Any]) -> None:
        """Declare what a spec holds (the YAML of `python -m tests.github_sim --users`)."""
        for user in spec.get("users") or []:
            user = {"login": user} if isinstance(user, str) else dict(user)
            self.add_user(**user)
        for org in spec.get("orgs") or []:
            org = dict(org)
            teams = org.pop("teams", None) or []
            self.add_org(**org)
            for team in teams:
                self.add_team(org["login"], **team)

    def _user(self, login: str) -> User:
        try:
            return self.users[login.lower()]
        except KeyError:
            raise SimError(f"no user {login}; add_user first") from None

    def _org(self, login: str) -> Org:
        try:
            return self.orgs[login.lower()]
        except KeyError:
            raise SimError(f"no organization {login}; add_org first") from None

    # -- OAuth ----------------------------------------------------------------------------

    def redirect_allowed(self, redirect_uri: str) -> bool:
        """GitHub's rule: the registered callback's scheme and host (sub-domains allowed) and
        port (any port on a loopback host), and its path or a sub-path of it."""
        if not self.callback_url:
            return False
        given, registered = urlsplit(redirect_uri), urlsplit(self.callback_url)
        host, home = (given.hostname or "").lower(), (registered.hostname or "").lower()
        if given.scheme != registered.scheme or not (host == home or host.endswith("." + home)):
            return False
        if host not in LOOPBACK and given.port != registered.port:
            return False
        base = registered.path.rstrip("/")
        path = given.path
        if "/../" in path + "/" or "/./" in path + "/":
            return False
        return path == base or path.rstrip("/") == base or path.startswith(base + "/")

    def issue_code(
        self,
        login: str,
        client_id: str,
        scopes: tuple[str, ...],
        redirect_uri: str,
        code_challenge: str = "",
    ) -> str:
        with self._lock:
            key = self._user(login).login.lower()
            code = secrets.token_hex(10)
            self.codes[code] = Grant(
                key,
                client_id,
                scopes,
                redirect_uri,
                code_challenge,
                self.clock() + CODE_LIFETIME_SECONDS,
            )
            return code

    def exchange_code(
        self,
        client_id: str,
        client_secret: str,
        code: str,
        redirect_uri: str = "",
        code_verifier: str = "",
    ) -> tuple[str, Grant]:
        """An access token for a code, once; OAuthError in GitHub's terms otherwise."""
        with self._lock:
            if client_id != self.client_id or client_secret != self.client_secret:
                raise OAuthError("incorrect_client_credentials")
            grant = self.codes.pop(code, None)
            if grant is None or grant.client_id != client_id or grant.expires_at < self.clock():
                raise OAuthError("bad_verification_code")
            if redirect_uri and redirect_uri != grant.redirect_uri:
                raise OAuthError("redirect_uri_mismatch")
            if grant.code_challenge and s256(code_verifier) != grant.code_challenge:
                raise OAuthError(
                    "bad_verification_code", "The code_verifier does not match the code_challenge."
                )
            token = "gho_" + secrets.token_urlsafe(27)[:36]
            self.tokens[token] = Grant(grant.login, client_id, grant.scopes)
            return token, self.tokens[token]

    def grant_for(self, token: str) -> Grant | None:
        with self._lock:
            return self.tokens.get(token)

    def revoke(self, token: str) -> None:
        """Forget a token (as when the user revokes the app): the API answers 401 to it."""
        with self._lock:
            self.tokens.pop(token, None)

    # -- reads, as the token's owner sees them -------------------------------------------

    def sees_private_membership(self, grant: Grant, org: Org) -> bool:
        return grant.login in org.members and bool(effective_scopes(grant.scopes) & ORG_SCOPES)

    def is_org_member(self, grant: Grant, org_login: str, login: str) -> bool:
        """GET /orgs/{org}/members/{user}: private membership needs the requester to be a
        member with `read:org`; anyone else sees public membership only."""
        with self._lock:
            org = self.orgs.get(org_login.lower())
            login = login.lower()
            if org is None or login not in org.members:
                return False
            return login in org.public_members or self.sees_private_membership(grant, org)

    def visible_team(self, grant: Grant, org_login: str, slug: str) -> Team | None:
        with self._lock:
            org = self.orgs.get(org_login.lower())
            team = org.teams.get(slug.lower()) if org else None
            if team is None or not self.sees_private_membership(grant, org):
                return None
            if team.privacy == "secret" and not (
                grant.login in team.members or org.members.get(grant.login) == "admin"
            ):
                return None
            return team

    def in_team(self, team: Team, login: str) -> bool:
        """Whether ``login`` is a member of ``team`` or of a team nested in it (any depth),
        as GitHub's team member endpoints count."""
        with self._lock:
            org = self.orgs[team.org.lower()]
            todo, seen = [team.slug.lower()], set()
            while todo:
                slug = todo.pop()
                if slug in seen:
                    continue
                seen.add(slug)
                if login.lower() in org.teams[slug].members:
                    return True
                todo += [t.slug.lower() for t in org.teams.values() if t.parent == slug]
            return False

    def teams_of(self, login: str) -> list[Team]:
        """Every team the user belongs to directly (GET /user/teams lists no parent teams),
        in organizations whose data a token of the user may see; by organization, slug."""
        with self._lock:
            return [
                team
                for org in sorted(self.orgs.values(), key=lambda o: o.login.lower())
                if org.hidden_by(login.lower()) is None
                for team in sorted(org.teams.values(), key=lambda t: t.slug)
                if login.lower() in team.members
            ]

    def sso_hidden_orgs(self, login: str) -> list[Org]:
        """The user's organizations left out of their lists for want of SSO authorization."""
        with self._lock:
            return [
                org
                for org in sorted(self.orgs.values(), key=lambda o: o.login.lower())
                if login.lower() in org.members and org.hidden_by(login.lower()) == "saml"
            ]

    def orgs_of(self, grant: Grant) -> list[Org]:
        """GET /user/orgs: all the user's organizations with `read:org`, else public ones;
        never those whose data the app may not see."""
        with self._lock:
            return [
                org
                for org in sorted(self.orgs.values(), key=lambda o: o.login.lower())
                if grant.login in org.members
                and org.hidden_by(grant.login) is None
                and (grant.login in org.public_members or self.sees_private_membership(grant, org))
            ]

    def memberships_of(self, login: str) -> list[Org]:
        """GET /user/memberships/orgs: every organization the user is in, restrictions or
        not (the user's own membership is theirs to see)."""
        with self._lock:
            return [
                org
                for org in sorted(self.orgs.values(), key=lambda o: o.login.lower())
                if login.lower() in org.members
            ]
