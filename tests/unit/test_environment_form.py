"""The spawn form's environment picker (spawner/core/environment_form.py): grouped, filterable,
tagged, and both directions of fit shown by one rule (environments.unfit_reason)."""

import json
import re
from html import unescape

import pytest

from spawner.core.catalog import Catalog
from spawner.core.environment_form import OWN_IMAGE, SCRIPT, Picker, render_picker
from spawner.core.environments import Environment, unfit_reason
from spawner.core.form import Choice, CourseOffer, options_from_form, render_form
from tests.unit.test_form import TEN

CATALOG = Catalog.load()
MINIMAL = Environment("gputap", "gputap minimal", framework="Python", tags=("python",),
                      default=True)  # fmt: skip
TORCH = Environment("torch", "PyTorch 2.13", "numpy, pandas and PyTorch", ("pytorch", "cuda-12.8"),
                    framework="PyTorch", needs_gpu=True, min_gpu_memory_gb=20)  # fmt: skip
TF = Environment("tf", "TensorFlow 2.20", tags=("tensorflow",), framework="TensorFlow")
BARE = Environment("bare", "No framework")
SLICE = CATALOG.offering("A100-80GB/1g.10gb")
A100 = CATALOG.offering("A100-80GB")


def many(n: int) -> list[Environment]:
    frameworks = ["PyTorch", "TensorFlow", "JAX", "vLLM", ""]
    return [MINIMAL] + [
        Environment(
            f"env-{i:03d}",
            f"Environment {i}",
            tags=(f"cuda-12.{i % 9}", f"v{i}"),
            framework=frameworks[i % 5],
            min_gpu_memory_gb=(i % 4) * 10,
        )  # fmt: skip
        for i in range(n - 1)
    ]


def options(html: str) -> dict[str, str]:
    """value -> the option's label, its reason when disabled, for every environment radio."""
    found = {}
    for label in re.findall(r'<label class="gputap-env[^"]*".*?</label>', html, re.S):
        value = re.search(r'name="environment" value="([^"]+)"', label).group(1)
        why = re.search(r'<span class="gputap-env-why">([^<]*)</span>', label)
        disabled = re.search(r'name="environment" value="[^"]+"[^>]* disabled', label)
        found[value] = unescape(why.group(1)) if disabled and why else ""
    return found


def test_150_environments_are_grouped_by_framework_with_their_tags_and_a_filter_box():
    envs = many(150)
    html = render_picker(Picker(envs, "gputap"), None)
    groups = re.findall(r'<div class="gputap-env-group" data-framework="([^"]+)">', html)
    assert groups == ["JAX", "Python", "PyTorch", "TensorFlow", "vLLM", "Other"]  # Other last
    assert len(options(html)) == 150
    assert 'id="gputap-env-filter"' in html and "Filter the 150 environments" in html
    assert '<span class="gputap-tag">cuda-12.3</span>' in html
    # what the filter matches: key, name, framework and tags, in lower case
    assert 'data-search="env-012 environment 12 jax cuda-12.3 v12"' in html
    assert re.search(r'value="gputap" checked', html)


def test_an_environment_the_checked_option_cannot_run_is_disabled_saying_why():
    html = render_picker(Picker([MINIMAL, TORCH, TF], "gputap"), SLICE)
    assert options(html) == {
        "gputap": "",
        "torch": "needs ≥ 20 GB of GPU memory; A100-80GB 1g.10gb slice has 10 GB",
        "tf": "",
    }
    assert options(render_picker(Picker([MINIMAL, TORCH], "gputap"), CATALOG.cpu)) == {
        "gputap": "",
        "torch": "needs a GPU",
    }
    assert options(render_picker(Picker([MINIMAL, TORCH], "gputap"), A100))["torch"] == ""


def test_the_form_shows_the_picker_first_and_its_rows_carry_what_the_script_checks():
    choices = [Choice(SLICE, 3, 3, 1, 1_142_857), Choice(A100, 1, 1, 1, 8_000_000)]
    html = render_form(choices, credit=TEN, simulated=False, preview_url="/p",
                       picker=Picker([MINIMAL, TORCH], "gputap"))  # fmt: skip
    assert html.index('id="gputap-environments"') < html.index('name="choice"')
    # the first free option (the slice) is checked: torch cannot run on it
    assert options(html)["torch"].startswith("needs ≥ 20 GB")
    assert 'data-kind="slice" data-memory-gb="10" data-label="A100-80GB 1g.10gb slice"' in html
    assert 'data-kind="card" data-memory-gb="80" data-label="A100-80GB"' in html
    assert 'id="gputap-environments"' not in render_form(
        choices, credit=TEN, simulated=False, preview_url="/p"
    )


def test_a_course_row_names_the_environment_its_instructor_pinned():
    course = CourseOffer("ml-101", "ML 101", {SLICE.key: 3.0}, "Monday 00:00 UTC",
                         environment="torch")  # fmt: skip
    html = render_form([Choice(SLICE, 3, 3, 1, 1_142_857)], credit=TEN, simulated=False,
                       preview_url="/p", courses=[course],
                       picker=Picker([MINIMAL, TORCH], "gputap"))  # fmt: skip
    assert 'data-course="ml-101" data-kind="slice"' in html
    assert 'data-environment="torch"' in html


@pytest.mark.parametrize(
    ("environment", "offering"),
    [(TORCH, CATALOG.cpu), (TORCH, SLICE), (TORCH, CATALOG.offering("T4/shared")), (TORCH, A100)],
)
def test_the_scripts_reasons_are_the_spawners(environment, offering):
    """The browser computes the reasons from data attributes with the texts the script
    carries; filled in as the script fills them, they are unfit_reason's, word for word."""
    script = SCRIPT
    texts = json.loads(re.search(r"var TEXT = (\{.*?\});", script, re.S).group(1))
    need = f"{environment.min_gpu_memory_gb:g}"
    if offering.kind == "cpu":
        shown = texts["gpu"]
    elif offering.kind == "shared":
        shown = texts["shared"].format(need=need)
    elif offering.memory_gb < environment.min_gpu_memory_gb:
        shown = texts["memory"].format(need=need, label=offering.label,
                                       memory=f"{offering.memory_gb:g}")  # fmt: skip
    else:
        shown = ""
    assert shown == unfit_reason(environment, offering)


def test_the_posted_environment_or_own_image_becomes_user_options():
    assert options_from_form({"choice": ["cpu:cpu"], "environment": ["tf"]}) == {
        "kind": "cpu",
        "environment": "tf",
    }
    posted = {"choice": ["cpu:cpu"], "environment": [OWN_IMAGE], "image": [" ghcr.io/a/b:1 "]}
    assert options_from_form(posted) == {"kind": "cpu", "image": "ghcr.io/a/b:1"}


def test_a_free_text_image_field_is_offered_only_with_a_pattern():
    plain = render_picker(Picker([MINIMAL, TF], "gputap"), None)
    assert 'name="image"' not in plain
    own = render_picker(Picker([MINIMAL], OWN_IMAGE, r"ghcr\.io/acme/.+", "ghcr.io/acme/x:1"), None)
    assert re.search(rf'value="{OWN_IMAGE}" checked', own)
    assert 'name="image" id="gputap-image" maxlength="255" value="ghcr.io/acme/x:1"' in own
