"""GitHub's failing answers told apart, in the words the login page shows (pure)."""

from datetime import UTC, datetime

from hub_config.github_errors import classify

NOW = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)


def body(message):
    return f'{{"message": "{message}"}}'.encode()


def test_success_and_not_a_member_are_no_failure():
    assert classify(204, {}, b"", "x", NOW) is None
    assert classify(404, {}, body("Not Found"), "x", NOW) is None


def test_outages_ask_to_retry():
    for status in (None, 500, 502, 503):
        e = classify(status, {}, b"", "your teams", NOW)
        assert (e.status_code, e.kind) == (503, "unavailable")
        assert "GitHub did not answer gputap's request for your teams" in e.jupyterhub_message
        assert "try again" in e.jupyterhub_message
        assert 'href="oauth_login"' in e.jupyterhub_html_message


def test_rate_limits_say_when_to_retry():
    e = classify(429, {"Retry-After": "90"}, b"", "your teams", NOW)
    assert (e.status_code, e.kind) == (503, "rate_limited")
    assert "Try again after 16:01 UTC (90 s)" in e.jupyterhub_message
    reset = str(int(datetime(2026, 12, 1, 16, 30, tzinfo=UTC).timestamp()))
    e = classify(
        403,
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset},
        body("API rate limit exceeded for user ID 7."),
        "who you are",
        NOW,
    )
    assert e.kind == "rate_limited" and "after 16:30 UTC (1800 s)" in e.jupyterhub_message
    assert "API rate limit exceeded" in e.jupyterhub_message
    e = classify(429, {}, b"", "x", NOW)
    assert "Try again in a few minutes." in e.jupyterhub_message


def test_saml_names_the_organization_and_links_its_sso_page():
    url = "http://127.0.0.1:9/orgs/acme/sso?authorization_request=T1"
    e = classify(
        403,
        {"X-GitHub-SSO": f"required; url={url}"},
        body("Resource protected by organization SAML enforcement."),
        "whether you are a member of acme",
        NOW,
        org="acme",
    )
    assert (e.status_code, e.kind, e.url) == (403, "saml", url)
    assert "acme requires SAML single sign-on" in e.jupyterhub_message
    assert f'<a id="gputap-github-sso" href="{url.replace("&", "&amp;")}">' in (
        e.jupyterhub_html_message
    )


def test_an_organization_that_has_not_approved_the_app_says_what_its_owner_must_do():
    message = (
        "Although you appear to have the correct authorization credentials, the `acme` "
        "organization has enabled OAuth App access restrictions, meaning that data access to "
        "third-parties is limited."
    )
    e = classify(403, {}, body(message), "whether you are a member of acme", NOW, org="acme")
    assert (e.status_code, e.kind) == (403, "app_restricted")
    assert "acme has not approved gputap's OAuth app" in e.jupyterhub_message
    assert "Third-party access, OAuth app policy" in e.jupyterhub_message


def test_revoked_token_and_other_refusals():
    e = classify(401, {}, body("Bad credentials"), "who you are", NOW)
    assert (e.status_code, e.kind) == (403, "token_revoked")
    e = classify(403, {}, body("Forbidden"), "who you are", NOW)
    assert (e.status_code, e.kind) == (403, "refused")
    assert "GitHub refused gputap's request for who you are (it answered 403: Forbidden)" in (
        e.jupyterhub_message
    )
