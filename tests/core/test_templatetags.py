from datetime import timedelta

from django.utils import timezone

from core.templatetags.ui import compact, event_label, http_url, money, size, summary_line, when


def test_when_shows_the_date_time_and_zone_and_the_relative_time_on_hover():
    moment = timezone.now() - timedelta(minutes=3)
    html = when(moment)
    assert html.startswith(f'<time datetime="{moment.isoformat()}"')
    assert 'title="3\xa0minutes ago"' in html
    shown = timezone.localtime(moment).strftime("%Y-%m-%d\xa0%H:%M\xa0UTC")
    assert html.endswith(f">{shown}</time>")


def test_money_carries_the_currency_and_a_real_minus(settings):
    settings.COST_CURRENCY = "EUR"
    assert money(2919.531) == "EUR\xa02,919.53"
    assert money(-1459.53) == "\u2212EUR\xa01,459.53"
    assert money(-1459.53, "abs") == "EUR\xa01,459.53"
    assert money(None) == "—"


def test_only_http_links_survive():
    assert http_url("https://mlflow.internal/#/runs/1") == "https://mlflow.internal/#/runs/1"
    assert http_url("javascript:alert(1)") == ""
    assert http_url(" JaVaScRiPt:alert(1)") == ""


def test_small_formatters():
    assert compact(24576) == "24.6k"
    assert compact(999) == "999"
    assert event_label("version.approve") == "approved"
    assert event_label("rollout.promote") == "started promoting"
    assert event_label("grant.something_new") == "grant something new"


def test_sizes_are_binary_and_say_so():
    assert size(None) == "—"
    assert size(512) == "512\xa0bytes"
    assert size(1536) == "1.5\xa0KiB"
    assert size(48 * 1024**3) == "48.0\xa0GiB"
    assert size(3 * 1024**4) == "3.0\xa0TiB"


def test_an_error_is_summarised_by_its_last_line():
    trace = "Traceback (most recent call last):\n  File \"/srv/x.py\", line 3\nKeyError: 'lora'\n"
    assert summary_line(trace) == "KeyError: 'lora'"
    assert summary_line("x" * 200).endswith("…") and len(summary_line("x" * 200)) == 120
    assert summary_line("") == ""
