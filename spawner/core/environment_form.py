"""The spawn form's environment picker: the environments this user may choose, grouped by
framework, with their tags, a filter box that keeps 150 of them usable, and both directions of
fit shown before anything is posted: an environment the checked GPU option cannot run is
disabled with the reason, and so is a GPU option the chosen environment cannot run on (the
rule is :func:`~.environments.unfit_reason`, the same the spawner applies to the request).

Pure: :func:`render_picker` takes the allowed environments and the form's options and returns
HTML; the browser side (``SCRIPT``, placed after the form's options) keeps both directions
current as the user picks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from .catalog import Offering
from .environments import Environment, unfit_reason

#: the group of environments that name no framework
OTHER = "Other"
#: the environment radio that stands for a free-text image
OWN_IMAGE = "__image__"


@dataclass(frozen=True)
class Picker:
    """What the picker offers: the environments this user may choose (the default among
    them), the one to check, and whether a free-text image is allowed (its pattern)."""

    environments: Sequence[Environment]
    selected: str
    image_pattern: str = ""
    image: str = ""


def _needs(environment: Environment) -> str:
    if environment.min_gpu_memory_gb > 0:
        return f"needs ≥ {environment.min_gpu_memory_gb:g} GB of GPU memory"
    return "needs a GPU" if environment.needs_gpu else ""


def _option(environment: Environment, checked: bool, reason: str) -> str:
    e = environment
    tags = "".join(f'<span class="gputap-tag">{escape(t)}</span>' for t in e.tags)
    search = " ".join((e.key, e.name, e.framework, *e.tags)).lower()
    needs = _needs(e)
    disabled = " disabled" if reason and not checked else ""
    return (
        f'<label class="gputap-env{" gputap-out" if disabled else ""}" '
        f'data-search="{escape(search)}" data-needs-gpu="{int(e.needs_gpu)}" '
        f'data-min-gpu-memory="{e.min_gpu_memory_gb:g}" data-name="{escape(e.name)}">'
        f'<input type="radio" name="environment" value="{escape(e.key)}"'
        f"{' checked' if checked else ''}{disabled}>"
        f" <b>{escape(e.name)}</b>{tags}"
        + (f' <span class="gputap-env-needs">{escape(needs)}</span>' if needs else "")
        + (
            f' <span class="gputap-env-about">{escape(e.description)}</span>'
            if e.description
            else ""
        )
        + f'<span class="gputap-env-why">{escape(reason) if disabled else ""}</span></label>'
    )


def render_picker(picker: Picker, checked_offering: Offering | None) -> str:
    """The environment fieldset. ``checked_offering`` is the GPU option the form checks
    first (None: a spec, which is raised to what the environment needs, or nothing): an
    environment it cannot run is disabled with the reason until another option is picked."""
    groups: dict[str, list[Environment]] = {}
    for e in sorted(picker.environments, key=lambda e: (e.framework.lower(), e.name.lower())):
        groups.setdefault(e.framework or OTHER, []).append(e)
    ordered = sorted(groups, key=lambda g: (g == OTHER, g.lower()))
    parts = [
        '<fieldset id="gputap-environments"><legend>Environment</legend>',
        '<input type="search" id="gputap-env-filter" autocomplete="off" '
        'placeholder="Filter by name or tag (pytorch, cuda-12.8…)" '
        f'aria-label="Filter the {len(picker.environments)} environments">'
        '<span id="gputap-env-count"></span>',
        '<div id="gputap-env-list">',
    ]
    for group in ordered:
        parts.append(
            f'<div class="gputap-env-group" data-framework="{escape(group)}">'
            f"<h4>{escape(group)}</h4>"
        )
        for e in groups[group]:
            reason = unfit_reason(e, checked_offering) if checked_offering else ""
            parts.append(_option(e, e.key == picker.selected, reason))
        parts.append("</div>")
    if picker.image_pattern:
        own = picker.selected == OWN_IMAGE
        parts.append(
            '<div class="gputap-env-group" data-framework="own image"><h4>Your own image</h4>'
            '<label class="gputap-env" data-search="image own" data-needs-gpu="0" '
            'data-min-gpu-memory="0" data-name="your own image">'
            f'<input type="radio" name="environment" value="{OWN_IMAGE}"'
            f"{' checked' if own else ''}> an image of your own, which must hold "
            "jupyterhub-singleuser:</label> "
            f'<input type="text" name="image" id="gputap-image" maxlength="255" '
            f'value="{escape(picker.image)}" '
            f'placeholder="allowed: {escape(picker.image_pattern[:80])}"></div>'
        )
    parts.append('<p id="gputap-env-none" hidden>No environment matches.</p></div></fieldset>')
    return "".join(parts)


def offering_data(offering: Offering) -> str:
    """The data attributes a GPU option's row carries for the picker's script."""
    return (
        f' data-kind="{escape(offering.kind)}" data-memory-gb="{offering.memory_gb:g}"'
        f' data-label="{escape(offering.label)}"'
    )


# the same rule as environments.unfit_reason, kept in step by tests/unit/test_environment_form.py;
# it goes after the whole form (it reads the GPU options' rows)
SCRIPT = (
    """
<script>
(function () {
  var envs = Array.prototype.slice.call(document.querySelectorAll(".gputap-env"));
  var filter = document.getElementById("gputap-env-filter");
  var count = document.getElementById("gputap-env-count");
  var TEXT = """
    + json.dumps(
        {
            "gpu": "needs a GPU",
            "shared": "needs ≥ {need} GB of GPU memory; a shared GPU guarantees none",
            "memory": "needs ≥ {need} GB of GPU memory; {label} has {memory} GB",
            "unfit": "{label} cannot run the environment you chose ({env}: {why})",
            "pinned": "the course you chose runs its servers in {name}",
        },
        ensure_ascii=False,
    )
    + """;
  function fmt(text, values) {
    return text.replace(/\\{(\\w+)\\}/g, function (_, k) { return values[k]; });
  }
  function why(env, row) {
    if (!row || row.dataset.kind === undefined) return "";  // a spec: raised to the need
    var need = parseFloat(env.dataset.minGpuMemory), kind = row.dataset.kind;
    if (kind === "cpu") return (env.dataset.needsGpu === "1" || need > 0) ? TEXT.gpu : "";
    if (need <= 0) return "";
    if (kind === "shared") return fmt(TEXT.shared, {need: need});
    var memory = parseFloat(row.dataset.memoryGb);
    if (memory >= need) return "";
    return fmt(TEXT.memory, {need: need, label: row.dataset.label, memory: memory});
  }
  function rowOf(radio) { return radio && radio.closest("[data-kind]"); }
  function refresh() {
    var chosen = document.querySelector('input[name="environment"]:checked');
    var envRow = chosen && chosen.closest(".gputap-env");
    var checked = rowOf(document.querySelector('input[name="choice"]:checked'));
    // a course whose instructor pinned an environment runs its servers there
    var pin = checked && checked.dataset.environment;
    var pinned = pin && document.querySelector(
      'input[name="environment"][value="' + CSS.escape(pin) + '"]');
    if (pinned) {
      pinned.checked = true;
      envRow = pinned.closest(".gputap-env");
    }
    envs.forEach(function (env) {
      var radio = env.querySelector("input"), reason = why(env, checked);
      if (pinned && radio !== pinned) reason = fmt(TEXT.pinned, {name: envRow.dataset.name});
      radio.disabled = !!reason && !radio.checked;
      env.classList.toggle("gputap-out", radio.disabled);
      env.querySelector(".gputap-env-why").textContent = radio.disabled ? reason : "";
    });
    document.querySelectorAll('input[name="choice"]').forEach(function (radio) {
      var row = rowOf(radio);
      if (!row || !envRow) return;
      var reason = why(envRow, row);
      // what the form disabled itself (credit short) stays disabled
      if (radio.dataset.gputapOff === undefined) radio.dataset.gputapOff = radio.disabled ? 1 : "";
      radio.disabled = radio.dataset.gputapOff === "1" || (!!reason && !radio.checked);
      var note = row.querySelector(".gputap-env-unfit");
      if (!note) {
        note = document.createElement("div");
        note.className = "gputap-env-unfit";
        row.appendChild(note);
      }
      note.textContent = reason ? fmt(TEXT.unfit, {label: row.dataset.label,
        env: envRow.dataset.name, why: reason}) : "";
    });
  }
  function applyFilter() {
    var words = filter.value.toLowerCase().split(/\\s+/).filter(Boolean), shown = 0;
    envs.forEach(function (env) {
      var match = words.every(function (w) { return env.dataset.search.indexOf(w) >= 0; });
      env.hidden = !match;
      if (match) shown++;
    });
    document.querySelectorAll(".gputap-env-group").forEach(function (group) {
      group.hidden = !group.querySelector(".gputap-env:not([hidden])");
    });
    document.getElementById("gputap-env-none").hidden = shown > 0;
    count.textContent = words.length ? " " + shown + " of " + envs.length : "";
  }
  filter.addEventListener("input", applyFilter);
  document.addEventListener("change", function (event) {
    if (event.target.name === "environment" || event.target.name === "choice") refresh();
  });
  var image = document.getElementById("gputap-image");
  if (image) image.addEventListener("input", function () {
    document.querySelector('input[name="environment"][value="__image__"]').checked = true;
    refresh();
  });
  refresh();
})();
</script>
"""
)

STYLE = """
<style>
#gputap-environments h4{margin:8px 0 2px;font-size:95%;color:#333}
#gputap-env-filter{width:22em;margin-bottom:4px}
#gputap-env-list{max-height:22em;overflow-y:auto}
.gputap-env{display:block;padding:2px 0;font-weight:normal}
.gputap-tag{margin-left:6px;padding:0 5px;border-radius:3px;background:#e5e7eb;font-size:85%}
.gputap-env-needs,.gputap-env-about{margin-left:8px;color:#555;font-size:90%}
.gputap-env-why,.gputap-env-unfit{margin-left:26px;color:#b00;font-size:90%;display:block}
.gputap-env-why:empty,.gputap-env-unfit:empty{display:none}
</style>
"""
