"""The spawn form as a logged-in user sees it, and the spec preview behind it."""

import re

import requests

from gputap_common.money import format_credits


def row(page: str, key: str) -> str:
    match = re.search(
        rf'<div class="gputap-choice[^"]*" data-key="{re.escape(key)}"[^>]*>.*?</div>', page, re.S
    )
    assert match, f"no option {key} in the form"
    return match[0]


def test_login_page_says_it_is_a_development_login(platform):
    page = requests.get(f"{platform.url}/hub/login", timeout=10).text
    assert "Development login" in page


def test_form_lists_options_with_free_counts_prices_and_time_left(platform):
    s = platform.login("frank")
    page = s.get(f"{platform.url}/hub/spawn", timeout=30).content.decode()
    assert "simulated" in page
    # 10.00 credits of trial; an RTX 4090 at 5.00/h lasts 2 h, a 1g.10gb slice 8 h 45 min
    gpu = row(page, "RTX-4090")
    assert "simulated" in gpu and "24 GB · 165.2 FP16 TFLOPS" in gpu
    assert "2 of 2 free" in gpu and "5.00/h" in gpu and "credit lasts 2 h 00 min" in gpu
    slice_ = row(page, "A100-80GB/1g.10gb")
    assert "A100-80GB 1g.10gb slice" in slice_ and "3 of 3 free" in slice_
    assert "1.142857/h" in slice_ and "credit lasts 8 h 45 min" in slice_
    assert "CPU only" in page
    assert 'id="gputap-available">10.00<' in page


def test_sold_out_option_is_shown_with_free_alternatives(platform):
    platform.create_user("gina")
    r = platform.spawn("gina", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("gina")
    s = platform.login("hank")
    page = s.get(f"{platform.url}/hub/spawn", timeout=30).content.decode()
    sold_out = row(page, "A100-80GB")
    assert "gputap-out" in sold_out and "sold out" in sold_out and "(0 of 1)" in sold_out
    assert "Free now instead:" in sold_out
    # submitting the sold-out option anyway explains itself on the form
    r = s.post(
        f"{platform.url}/hub/spawn",
        data={"choice": "card:A100-80GB", "_xsrf": s.cookies.get("_xsrf")},
        timeout=60,
    )
    assert "No A100-80GB free now (0 of 1 free)" in r.text
    assert "Ask to wait in the queue" in r.text
    platform.stop_server("gina")


def test_with_no_credit_the_form_and_its_start_say_why_nothing_could_be_picked(platform):
    s = platform.login("broke")
    assert 'id="gputap-available">10.00<' in s.get(f"{platform.url}/hub/spawn", timeout=30).text
    platform.adjust("broke", "-10.00")
    page = s.get(f"{platform.url}/hub/spawn", timeout=30).text
    assert "No option is within your credit" in page
    # what the browser posts: the form's hidden fields, no option (every one is disabled)
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
    assert not re.search(r'name="choice" [^>]*checked', page)
    hidden["_xsrf"] = s.cookies.get("_xsrf")
    r = s.post(f"{platform.url}/hub/spawn", data=hidden, timeout=60)
    assert "No option is within your credit, so none could be picked: add credit" in r.text
    assert "kind must be" not in r.text
    assert (
        platform.api.get(f"{platform.url}/hub/api/users/broke", timeout=10).json()["servers"] == {}
    )


def test_spec_preview_names_the_card_before_committing(platform):
    s = platform.login("ivan")
    url = f"{platform.url}/hub/gputap/preview"
    answer = s.get(url, params={"min_memory_gb": 32, "min_tflops": 80, "count": 1}, timeout=30)
    assert answer.json() == {
        "ok": True,
        "offering": "A100-80GB",
        "count": 1,
        "price_per_hour_micro": 8_000_000,
        "message": f"You would get A100-80GB (simulated) at {format_credits(8_000_000)}/h.",
    }
    small = s.get(url, params={"min_memory_gb": 8, "min_tflops": 20}, timeout=30).json()
    assert small["offering"] == "A100-80GB/1g.10gb"  # the cheapest fit is a slice
    bad = s.get(url, params={"min_memory_gb": -3}, timeout=30).json()
    assert bad["ok"] is False and "must not be negative" in bad["message"]
    never = s.get(url, params={"min_memory_gb": 200}, timeout=30).json()
    assert never["ok"] is False and "No machine here has" in never["message"]
    # not logged in: no answer
    assert requests.get(url, timeout=10, allow_redirects=False).status_code in (302, 403)
