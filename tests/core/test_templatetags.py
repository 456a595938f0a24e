from datetime import timedelta

from django.utils import timezone

from core.templatetags.ui import compact, event_label, http_url, size, when


def test_when_puts_the_exact_time_in_the_title():
    html = when(timezone.now() - timedelta(minutes=3))
    assert html.startswith('<time datetime="')
    assert 'title="' in html and "UTC" in html
    assert html.endswith(">3\xa0minutes ago</time>")


def test_only_http_links_survive():
    assert http_url("https://mlflow.internal/#/runs/1") == "https://mlflow.internal/#/runs/1"
    assert http_url("javascript:alert(1)") == ""
    assert http_url(" JaVaScRiPt:alert(1)") == ""


def test_small_formatters():
    assert compact(24576) == "24.6k"
    assert compact(999) == "999"
    assert event_label("version.approve") == "approved"
    assert event_label("something.new") == "something.new"


def test_sizes_are_binary_and_say_so():
    assert size(None) == "—"
    assert size(512) == "512\xa0bytes"
    assert size(1536) == "1.5\xa0KiB"
    assert size(48 * 1024**3) == "48.0\xa0GiB"
    assert size(3 * 1024**4) == "3.0\xa0TiB"
