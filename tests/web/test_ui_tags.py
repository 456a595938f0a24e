from datetime import timedelta

from django.utils import timezone

from registry.templatetags.ui import compact, event_label, http_url, relative, when


def test_relative_times_read_like_people_speak():
    now = timezone.now()
    assert relative(now - timedelta(seconds=10), now) == "just now"
    assert relative(now - timedelta(seconds=50), now) == "1 min ago"
    assert relative(now - timedelta(minutes=3), now) == "3 min ago"
    assert relative(now - timedelta(hours=5), now) == "5 h ago"
    assert relative(now - timedelta(days=2), now) == "2 d ago"
    assert relative(now + timedelta(days=90), now) == "in 3 mo"


def test_when_puts_the_exact_time_in_the_title():
    html = when(timezone.now() - timedelta(minutes=3))
    assert html.startswith('<time datetime="')
    assert 'title="' in html and "UTC" in html
    assert html.endswith(">3 min ago</time>")


def test_only_http_links_survive():
    assert http_url("https://mlflow.internal/#/runs/1") == "https://mlflow.internal/#/runs/1"
    assert http_url("javascript:alert(1)") == ""
    assert http_url(" JaVaScRiPt:alert(1)") == ""


def test_small_formatters():
    assert compact(24576) == "24.6k"
    assert compact(999) == "999"
    assert event_label("version.approve") == "approved"
    assert event_label("something.new") == "something.new"
