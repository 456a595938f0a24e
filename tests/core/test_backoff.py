from core.backoff import backoff_delay


def test_it_doubles_then_stops_at_the_cap():
    delays = [backoff_delay(n, base=0.5, cap=5) for n in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 5, 5]


def test_jitter_stays_between_half_and_the_full_delay():
    for _ in range(50):
        assert 2.0 <= backoff_delay(3, base=0.5, cap=60, jitter=True) <= 4.0


def test_huge_attempt_counts_do_not_overflow():
    assert backoff_delay(10_000, base=1, cap=30) == 30
