"""The spawn form: every option with what it is, how many are free, its price and how long
the user's credit lasts at that price; sold-out options with free alternatives; a spec request
with a live preview of the card it would get.

Pure: rendering takes data and returns HTML; ``options_from_form`` turns the posted fields
into the same ``user_options`` the REST API accepts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from html import escape

from gputap_common.hours import format_hours
from gputap_common.money import format_credits

from .asking import Credit, Refused, format_duration, picked_value
from .catalog import Offering
from .environment_form import OWN_IMAGE, Picker, offering_data, render_picker
from .environment_form import SCRIPT as PICKER_SCRIPT
from .environment_form import STYLE as PICKER_STYLE
from .form_assets import SCRIPT, STYLE
from .placement import MIG_PROFILE_KEY, Alternative, Placement, Refusal, RequestError


@dataclass(frozen=True)
class Choice:
    """One option of the form, with its live numbers."""

    offering: Offering
    free: int
    total: int
    max_count: int
    price_per_hour_micro: int | None
    alternatives: tuple[Alternative, ...] = ()


def credit_lasts(available_micro: int, price_per_hour_micro: int) -> int:
    """Whole seconds the available credit pays for at a price per hour."""
    if price_per_hour_micro <= 0:
        return 0
    return max(0, available_micro) * 3600 // price_per_hour_micro


def _value(choice: Choice) -> str:
    o = choice.offering
    return f"{o.kind}:{o.key}"


def _what(offering: Offering) -> str:
    if offering.kind == "cpu":
        return "no GPU"
    # a card the catalog does not know: its memory is what NVML says, its speed unknown
    speed = f"{offering.fp16_tflops:g} FP16 TFLOPS" if offering.known else "TFLOPS unknown"
    shared = ", shared" if offering.kind == "shared" else ""
    return f"{offering.memory_gb:g} GB · {speed}{shared}"


def _choice_id(value: str) -> str:
    return "gputap-c-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in value)


def _alternatives(alternatives: Sequence[Alternative]) -> str:
    """Buttons that select each alternative's own row (outside any label, so a click on
    them never selects the sold-out row they are listed under)."""
    buttons = " ".join(
        f'<button type="button" class="gputap-pick" '
        f'data-pick="{escape(a.offering.kind)}:{escape(a.offering.key)}">'
        f"{escape(a.offering.label)} ({a.free} free, {format_credits(a.price_per_hour_micro)}/h)"
        "</button>"
        for a in alternatives
    )
    return f'<div class="gputap-alt">Free now instead: {buttons}</div>' if buttons else ""


def _row(
    choice: Choice, credit: Credit, simulated: bool, first_free: bool, picked: Mapping | None
) -> str:
    o = choice.offering
    price = choice.price_per_hour_micro
    value = _value(choice)
    sold_out = o.kind != "cpu" and choice.free == 0
    label = escape(o.label) + (' <span class="gputap-sim">simulated</span>' if simulated else "")
    if o.kind == "cpu":
        availability = "always available"
    elif sold_out:
        availability = f'<span class="gputap-soldout">sold out</span> (0 of {choice.total})'
    else:
        availability = f"{choice.free} of {choice.total} free"
    available = credit.available_micro
    lasts = (
        f"credit lasts {format_duration(credit_lasts(available, price))}"
        if price
        else "no price set"
    )
    affordable = bool(price) and credit.covers(price)
    count = ""
    by_count = ""
    if o.kind == "card" and choice.max_count > 1 and price:
        # how long the credit lasts for each count, switched by the count selector
        texts = [
            f"credit lasts {format_duration(credit_lasts(available, price * n))}"
            for n in range(1, choice.max_count + 1)
        ]
        by_count = f" data-by-count='{escape(json.dumps(texts))}'"
    if o.kind == "card" and choice.max_count > 1:
        picked_count = str((picked or {}).get("count", "1"))
        options = "".join(
            f'<option value="{n}"'
            f"{' disabled' if price and not credit.covers(price * n) else ''}"
            f"{' selected' if str(n) == picked_count else ''}>{n}</option>"
            for n in range(1, choice.max_count + 1)
        )
        count = (
            f' × <select name="count:{escape(o.key)}" aria-label="number of {escape(o.key)}">'
            f"{options}</select>"
        )
    alternatives = _alternatives(choice.alternatives) if sold_out else ""
    short = ""
    if price and not affordable:
        short = f'<div class="gputap-short">Not enough credit: {credit.shortfall(price)}.</div>'
    # sold-out options stay selectable: with "wait in the queue" the spawn waits for one
    disabled = " disabled" if not affordable else ""
    if picked is not None:
        checked = " checked" if picked_value(picked) == value and not disabled else ""
    else:
        checked = " checked" if first_free and not disabled and not sold_out else ""
    price_text = f"{format_credits(price)}/h" if price else "—"
    out = " gputap-out" if disabled or sold_out else ""
    ident = _choice_id(value)
    return (
        f'<div class="gputap-choice{out}" data-key="{escape(o.key)}"{offering_data(o)}>'
        f'<input type="radio" name="choice" id="{ident}" value="{escape(value)}"'
        f"{disabled}{checked}>"
        f' <label for="{ident}"><b>{label}</b></label>{count}'
        f' <label for="{ident}"><span class="gputap-what">{_what(o)}</span>'
        f' <span class="gputap-free">{availability}</span>'
        f' <span class="gputap-price">{price_text}</span>'
        f' <span class="gputap-lasts"{by_count}>{lasts}</span></label>{short}{alternatives}'
        "</div>"
    )


@dataclass(frozen=True)
class CourseOffer:
    """A course of the user's, from billing: what it pays for and what is left this week."""

    slug: str
    name: str
    hours_left: Mapping[str, float]  # per allowed option, one GPU
    resets: str
    fallback: bool = False  # the student pays on with own credit when the hours are used up
    environment: str = ""  # the environment its servers run in, if its instructor pinned one
    max_workers: int = 0  # workers its servers may scale out to (0: none)


def course_offers(answer: Mapping[str, object]) -> list[CourseOffer]:
    """Billing's ``GET api/accounts/{user}/courses`` as offers."""
    return [
        CourseOffer(
            slug=c["slug"],
            name=c["name"],
            hours_left=dict(c["hours_left"]),
            resets=f"{c['reset_weekday'].capitalize()} {c['reset_time']} {c['timezone']}",
            fallback=bool(c.get("fallback")),
            environment=str(c.get("environment") or ""),
            max_workers=int(c.get("max_workers") or 0),
        )
        for c in answer.get("courses") or []
    ]


def course_refusal(offers: list[CourseOffer], slug: str, key: str) -> str | None:
    """Why the course ``slug`` would refuse to pay for ``key`` now, in billing's own words,
    or None (``offers``: the user's courses, from billing). Asked before a change stops the
    running server; the course's limit of GPUs at once is left to the new start, since the
    server being changed still counts against it until it stops."""
    offer = next((o for o in offers if o.slug == slug), None)
    if offer is None:
        # a course the user does not take reads as one that does not exist (docs/security.md)
        return (
            f"You take no active course {slug!r}; join it with its code or ask its "
            "instructor, or pick an option without the course to pay with your own credit."
        )
    if key not in offer.hours_left:
        return (
            f"{offer.name} pays for {', '.join(sorted(offer.hours_left))} only, not {key}. "
            "Pick one of those, or an option without the course to pay with your own credit."
        )
    if offer.hours_left[key] <= 0 and not offer.fallback:
        return (
            f"No {offer.name} hours left this week for {key}; they reset {offer.resets}. "
            "Pick an option without the course to pay with your own credit."
        )
    return None


def _course_choices(course: CourseOffer, choices: Sequence[Choice]) -> list[Choice]:
    """The options ``course`` pays for that this hub offers, in the form's order."""
    return [c for c in choices if c.offering.key in course.hours_left and c.offering.kind != "cpu"]


def _course_rows(
    course: CourseOffer, choices: Sequence[Choice], first: bool, picked: Mapping | None = None
) -> list[str]:
    """Radios for the options ``course`` pays for that this hub offers (free or not), each
    with how long the course's hours last on it (course hours pay; the credit does not)."""
    rows = []
    for choice in _course_choices(course, choices):
        o = choice.offering
        left = course.hours_left[o.key]
        usable = left > 0
        sold_out = choice.free == 0
        availability = (
            '<span class="gputap-soldout">sold out</span>'
            if sold_out
            else f"{choice.free} of {choice.total} free"
        )
        value = f"course:{course.slug}:{_value(choice)}"
        if picked is not None:
            checked = " checked" if usable and picked_value(picked) == value else ""
        else:
            checked = " checked" if first and usable and not sold_out else ""
        first = first and not checked
        rows.append(
            f'<label class="gputap-choice gputap-course{"" if usable else " gputap-out"}" '
            f'data-key="{escape(o.key)}" data-course="{escape(course.slug)}"'
            f'{offering_data(o)} data-environment="{escape(course.environment)}">'
            f'<input type="radio" name="choice" value="{escape(value)}"'
            f"{'' if usable else ' disabled'}{checked}>"
            f' <b>{escape(o.label)}</b> <span class="gputap-what">{_what(o)}</span>'
            f' <span class="gputap-free">{availability}</span>'
            f' <span class="gputap-left">{format_hours(left)} left this week '
            f"({escape(course.name)})</span></label>"
        )
    return rows


_GROUPS = (
    ("shared", "Shared GPUs (time-sliced: cheapest, no guaranteed speed)"),
    ("slice", "MIG slices"),
    ("card", "Whole GPUs"),
    ("cpu", "No GPU"),
)


#: the hidden field of a form on which no option was within the credit (options_from_form)
NOTHING_AFFORDABLE_FIELD = "nothing_affordable"
NOTHING_AFFORDABLE = (
    "No option is within your credit, so none could be picked: add credit, or ask your "
    "instructor to add you to a course that pays for GPU hours."
)
NOTHING_PICKED = "No option was picked: pick one of the options, then press Start."


def _beyond_credit(
    choices: Sequence[Choice], credit: Credit, courses: Sequence[CourseOffer]
) -> str:
    """The banner saying that no option is within the credit (with what the cheapest needs)
    and the hidden field telling :func:`options_from_form` so; "" when one is, or when none
    has a price (then it is not the credit's doing)."""
    prices = [c.price_per_hour_micro for c in choices if c.price_per_hour_micro]
    funded = any(
        course.hours_left[c.offering.key] > 0
        for course in courses
        for c in _course_choices(course, choices)
    )
    if not prices or funded or any(credit.covers(price) for price in prices):
        return ""
    return (
        f'<div class="gputap-banner" id="gputap-beyond-credit">{escape(NOTHING_AFFORDABLE)} '
        f"The cheapest option {escape(credit.shortfall(min(prices)))}.</div>"
        f'<input type="hidden" name="{NOTHING_AFFORDABLE_FIELD}" value="1">'
    )


def _held(credit: Credit) -> str:
    held = credit.available_micro - credit.free_micro
    if held <= 0:
        return ""
    return f"; {format_credits(held)} held for servers starting"


def _typed(values: Mapping[str, object], name: str, default: str) -> str:
    """What the user typed in a field, to show it again (escaped), or the default."""
    return escape(str(values.get(name, default)), quote=True)


def _course_summary(courses: Sequence[CourseOffer]) -> str:
    """Each course's hours left this week, apart from the credit: course hours pay only for
    the course's options and are not credit."""
    items = "".join(
        f'<li data-course="{escape(c.slug)}"><b>{escape(c.name)}</b>: '
        + ", ".join(f"{format_hours(h)} of {escape(k)}" for k, h in c.hours_left.items())
        + f" left this week (resets {escape(c.resets)})</li>"
        for c in courses
    )
    return (
        '<div id="gputap-course-hours">Course hours (not credit: each course pays only for '
        f"its own options):<ul>{items}</ul></div>"
    )


def render_form(
    choices: Sequence[Choice],
    *,
    credit: Credit,
    simulated: bool,
    preview_url: str,
    spot_discount_percent: int | None = None,
    offer_similar_on_fault: bool = False,
    notice: str = "",
    courses: Sequence[CourseOffer] = (),
    refused: Refused | None = None,
    picker: Picker | None = None,
) -> str:
    """HTML for JupyterHub's spawn page (inside its <form>).

    ``credit`` is the user's own (trial + paid): what "credit lasts" counts and what an
    option it cannot start is marked with; course hours are shown apart, per course.
    ``spot_discount_percent`` offers the interruptible choice (backends that can preempt);
    ``notice`` is shown first (e.g. why the user's last server was stopped); ``courses``
    come first, each with the options it pays for and the hours left this week;
    ``offer_similar_on_fault``: the choice to restart on a similar free GPU after a GPU
    fault (faults.restart: allowed); ``refused``: the last start was refused: say why,
    select what was asked again, and offer the alternatives as buttons that select them;
    ``picker``: the environments the user may choose (environment_form.py), shown before
    the GPU options.
    """
    currency = credit.currency
    picked = dict(refused.options) if refused else None
    parts = [STYLE, PICKER_STYLE if picker else "", '<div class="gputap-form">']
    if refused:
        # the sentence is shown here with its alternatives, so JupyterHub's own copy of it
        # ("Error: ...") above the form is hidden
        parts.append(
            "<style>.spawn-error-msg{display:none}</style>"
            '<div class="gputap-refusal" id="gputap-refusal" role="alert">'
            f"<p>{escape(refused.message)}</p>{_alternatives(refused.alternatives)}</div>"
        )
    if notice:
        parts.append(f'<div class="gputap-banner" id="gputap-notice">{escape(notice)}</div>')
    if simulated:
        parts.append(
            '<div class="gputap-banner">These GPUs are <b>simulated</b>: this machine has no '
            "NVIDIA GPU, so servers get made-up device UUIDs and no real GPU.</div>"
        )
    parts.append(
        f'<p id="gputap-credit">Your credit: <b id="gputap-available">'
        f"{format_credits(credit.available_micro)}</b> {escape(currency)} available "
        f'(<span id="gputap-trial">trial {format_credits(credit.trial_micro)}</span> + '
        f'<span id="gputap-paid">paid {format_credits(credit.paid_micro)}</span>'
        f"{_held(credit)}). Prices are per hour, billed per second while the server runs.</p>"
    )
    parts.append(_beyond_credit(choices, credit, courses))
    if courses:
        parts.append(_course_summary(courses))
    picker_at = len(parts)  # filled in once the checked option is known
    checked: Offering | None = None
    first_free = picked is None
    for course in courses:
        rows = _course_rows(course, choices, first_free, picked)
        if not rows:
            continue
        first_free = first_free and not any(" checked" in row for row in rows)
        if checked is None and not first_free:
            checked = next(
                (c.offering for c, r in zip(_course_choices(course, choices), rows, strict=True)
                 if " checked" in r),
                None,
            )  # fmt: skip
        parts.append(
            f'<fieldset class="gputap-course-group" data-course="{escape(course.slug)}">'
            f"<legend>Paid by {escape(course.name)} (hours reset {escape(course.resets)})"
            f"</legend>{''.join(rows)}</fieldset>"
        )
    for kind, title in _GROUPS:
        rows = [c for c in choices if c.offering.kind == kind]
        if not rows:
            continue
        parts.append(f"<fieldset><legend>{title}</legend>")
        for choice in rows:
            free = choice.offering.kind == "cpu" or choice.free > 0
            selectable = free and bool(choice.price_per_hour_micro)
            row = _row(choice, credit, simulated and kind != "cpu", first_free, picked)
            parts.append(row)
            if checked is None and " checked>" in row:
                checked = choice.offering
            first_free = first_free and not selectable
        parts.append("</fieldset>")
    spec = {k.removeprefix("spec_"): v for k, v in (refused.typed if refused else {}).items()}
    parts.append(
        f'<fieldset class="gputap-spec" id="gputap-spec" data-preview-url="{escape(preview_url)}">'
        "<legend>Or describe what you need</legend>"
        '<label><input type="radio" name="choice" value="spec" id="gputap-spec-radio"'
        f"{' checked' if picked_value(picked) == 'spec' else ''}> "
        "the cheapest free GPU with at least</label> "
        f'<input type="number" name="spec_min_memory_gb" min="0" step="any" '
        f'value="{_typed(spec, "min_memory_gb", "16")}"> GB and '
        f'<input type="number" name="spec_min_tflops" min="0" step="any" '
        f'value="{_typed(spec, "min_tflops", "0")}"> FP16 TFLOPS, '
        f'<input type="number" name="spec_count" min="1" step="1" '
        f'value="{_typed(spec, "count", "1")}"> GPU(s)'
        '<div id="gputap-spec-preview"></div></fieldset>'
    )
    flags = picked or {}
    run = [
        '<label class="gputap-choice"><input type="checkbox" name="queue" id="gputap-queue"'
        f"{' checked' if flags.get('queue') else ''}>"
        " If what I pick is sold out, wait in the queue for it (first come, first served; "
        "nothing is charged while waiting)</label>"
    ]
    if spot_discount_percent is not None:
        run.append(
            '<label class="gputap-choice"><input type="checkbox" name="spot" id="gputap-spot"'
            f"{' checked' if flags.get('spot') else ''}>"
            f" Interruptible (spot): {spot_discount_percent}% cheaper, but the server may be "
            "stopped when an on-demand server needs the GPU (your files stay)</label>"
        )
    if offer_similar_on_fault:
        similar = " checked" if flags.get("on_fault") == "similar" else ""
        run.append(
            '<label class="gputap-choice"><input type="checkbox" name="on_fault" '
            f'value="similar" id="gputap-on-fault"{similar}>'
            " If my GPU fails and the same is not free, restart me on the cheapest free GPU "
            "at least as large (it may cost more per hour)</label>"
        )
    parts.append(f"<fieldset><legend>How to run</legend>{''.join(run)}</fieldset>")
    parts.append("</div>")
    parts.append(SCRIPT)
    if picker:
        parts.insert(picker_at, render_picker(picker, checked))
        parts.append(PICKER_SCRIPT)
    return "\n".join(parts)


def _first(form: Mapping[str, Sequence[str]], name: str, default: str = "") -> str:
    values = form.get(name) or [default]
    return values[0]


def options_from_form(form_data: Mapping[str, Sequence[str]]) -> dict[str, object]:
    """Posted form fields → ``user_options`` (validated later, like the REST API's).

    A form posted with no option picked is a RequestError saying why: none was within the
    credit (the form said so), or none was picked."""
    if not _first(form_data, "choice"):
        beyond_credit = _first(form_data, NOTHING_AFFORDABLE_FIELD)
        raise RequestError(NOTHING_AFFORDABLE if beyond_credit else NOTHING_PICKED)
    options = _choice_options(form_data)
    environment = _first(form_data, "environment")
    if environment == OWN_IMAGE:
        options["image"] = _first(form_data, "image").strip()
    elif environment:
        options["environment"] = environment
    for flag in ("queue", "spot"):
        if _first(form_data, flag):
            options[flag] = True
    if _first(form_data, "on_fault") == "similar":
        options["on_fault"] = "similar"
    return options


def _choice_options(form_data: Mapping[str, Sequence[str]]) -> dict[str, object]:
    choice = _first(form_data, "choice")
    if choice.startswith("course:"):  # course:SLUG:KIND:KEY, one of the course's options
        _, slug, rest = choice.split(":", 2)
        return {**_choice_options({**form_data, "choice": [rest]}), "course": slug}
    kind, _, key = choice.partition(":")
    if kind == "card":
        return {"kind": "card", "card": key, "count": _first(form_data, f"count:{key}", "1")}
    if kind == "slice":
        card, _, profile = key.partition("/")
        return {"kind": "slice", "card": card, MIG_PROFILE_KEY: profile}
    if kind == "shared":
        return {"kind": "shared", "card": key.partition("/")[0]}
    if kind == "spec":
        return {
            "kind": "spec",
            "min_memory_gb": _first(form_data, "spec_min_memory_gb", "0"),
            "min_tflops": _first(form_data, "spec_min_tflops", "0"),
            "count": _first(form_data, "spec_count", "1"),
        }
    if kind == "cpu":
        return {"kind": "cpu"}
    return {"kind": choice}


def offering_options(offering: Offering, count: int = 1, course: str = "") -> dict[str, object]:
    """The ``user_options`` that ask for exactly ``offering`` (what the form would post)."""
    if offering.kind == "card":
        options: dict[str, object] = {"kind": "card", "card": offering.key, "count": count}
    elif offering.kind == "slice":
        options = {"kind": "slice", "card": offering.card, MIG_PROFILE_KEY: offering.profile}
    elif offering.kind == "shared":
        options = {"kind": "shared", "card": offering.card}
    else:
        options = {"kind": "cpu"}
    if course:
        options["course"] = course
    return options


def with_alternatives(refused: Refused, choices: Sequence[Choice], credit: Credit) -> Refused:
    """``refused`` with the options to offer instead: for a sold-out pick, the free
    alternatives placement names; for one the credit cannot start, the free options it can
    (cheapest first, at most three)."""
    if refused.alternatives:
        return refused
    wanted = picked_value(refused.options) or ""
    wanted = wanted.split(":", 2)[2] if wanted.startswith("course:") else wanted
    picked = next((c for c in choices if _value(c) == wanted), None)
    if picked is not None and picked.alternatives:
        return replace(refused, alternatives=picked.alternatives)
    affordable = tuple(
        Alternative(c.offering, c.free, c.price_per_hour_micro)
        for c in choices
        if c.price_per_hour_micro
        and c.offering.kind != "cpu"
        and c.free > 0
        and c is not picked
        and credit.covers(c.price_per_hour_micro)
    )
    return replace(refused, alternatives=affordable[:3])


def preview_answer(answer: Placement | Refusal, simulated: bool) -> dict[str, object]:
    """JSON for the spec preview: which card a spec request would get now."""
    if isinstance(answer, Placement):
        p = answer
        sim = " (simulated)" if simulated else ""
        count = f"{p.count}× " if p.count > 1 else ""
        return {
            "ok": True,
            "offering": p.offering.key,
            "count": p.count,
            "price_per_hour_micro": p.total_per_hour_micro,
            "message": (
                f"You would get {count}{p.offering.label}{sim} at "
                f"{format_credits(p.total_per_hour_micro)}/h."
            ),
        }
    return {"ok": False, "message": answer.message}
