"""One rule for GitHub organization and team names (gputap_common/github_names.py): kept as
JupyterHub's groups are, `org:team-slug` in lower case; a display name is refused with the
slug that fixes it."""

import pytest

from gputap_common.github_names import login_name, org_or_team, team_name
from gputap_common.settings import SettingsError, load_settings


@pytest.mark.parametrize(
    "written,kept",
    [
        ("acme:ml-staff", "acme:ml-staff"),
        ("Acme:ML-Staff", "acme:ml-staff"),
        ("  acme:ml-staff\n", "acme:ml-staff"),
        # Enterprise Managed Users and team slugs may hold _ and .
        ("Acme_EMU:ml.staff", "acme_emu:ml.staff"),
        ("uni.edu:dl_2026", "uni.edu:dl_2026"),
    ],
)
def test_teams_are_kept_as_lower_case_slugs(written, kept):
    assert team_name(written) == kept


@pytest.mark.parametrize(
    "written,says",
    [
        (
            "Acme:ML Staff",
            "use the team's slug as in its URL, github.com/orgs/acme/teams/ml-staff: acme:ml-staff",
        ),
        (
            "Acme:R&D  Team",
            "github.com/orgs/acme/teams/r-d-team: acme:r-d-team",
        ),
        ("@acme/ml-staff", "github.com/orgs/acme/teams/ml-staff: acme:ml-staff"),
        ("acme", "must be 'org:team-slug', not 'acme'"),
        ("acme:", "must be 'org:team-slug', not 'acme:'"),
        ("acme:a:b", "must be 'org:team-slug', not 'acme:a:b'"),
        ("-acme:staff", "must be 'org:team-slug'"),
        ("acme:-staff", "must be 'org:team-slug'"),
        ("a" * 40 + ":staff", "must be 'org:team-slug'"),
        ("acme:" + "s" * 101, "must be 'org:team-slug'"),
        (5, "must be 'org:team-slug', not 5"),
    ],
)
def test_what_is_no_team_slug_is_refused_with_the_fix(written, says):
    with pytest.raises(ValueError, match="^courses.instructor_teams") as refused:
        team_name(written, "courses.instructor_teams")
    assert says in str(refused.value)


def test_organizations_or_teams():
    assert org_or_team("Initech") == "initech"
    assert org_or_team("Acme:GPU-Users") == "acme:gpu-users"
    assert org_or_team("acme_emu") == "acme_emu"
    with pytest.raises(ValueError, match="github.com/acme-inc: acme-inc") as refused:
        org_or_team("Acme Inc", "hub.github.allowed_organizations")
    assert str(refused.value).startswith(
        "hub.github.allowed_organizations must be an organization 'org' or a team "
        "'org:team-slug', not 'Acme Inc'"
    )
    with pytest.raises(ValueError, match="github.com/orgs/acme/teams/gpu-users: acme:gpu-users"):
        org_or_team("acme:GPU Users")
    with pytest.raises(ValueError, match="not 'acme/'"):
        org_or_team("acme/")


@pytest.mark.parametrize(
    "written,kept",
    [("ada", "ada"), ("Ada-Lovelace", "ada-lovelace"), ("ada_acme", "ada_acme"), ("a.b", "a.b")],
)
def test_logins_are_kept_in_lower_case(written, kept):
    assert login_name(written) == kept


@pytest.mark.parametrize(
    "written",
    ["../../x", "..", "ada/bob", "ada\n", "ada\x00", "-ada", "ada lovelace", "", "a" * 40, 7],
)
def test_what_is_no_login_is_refused_saying_what_a_login_is(written):
    with pytest.raises(ValueError) as refused:
        login_name(written, "courses.instructors[0]")
    message = str(refused.value)
    assert message.startswith("courses.instructors[0] must be a login name: 1 to 39 of a-z")
    assert len(message) < 200


def test_an_instructor_in_the_settings_must_be_a_login(tmp_path):
    settings = tmp_path / "gputap.yaml"
    settings.write_text("courses:\n  instructors: [Ada, '../../x']\n")
    with pytest.raises(SettingsError, match=r"^courses.instructors\[1\] must be a login name"):
        load_settings(settings, environ={})
    settings.write_text("courses:\n  instructors: [Ada, bob]\n")
    assert load_settings(settings, environ={}).courses["instructors"] == ["ada", "bob"]
