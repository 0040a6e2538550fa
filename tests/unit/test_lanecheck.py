"""tests/lanecheck.py: the oracle the integration tests read the NAS reader limit with."""
from lanecheck import most_at_once


def test_most_at_once_counts_overlapping_windows_only():
    t = "2026-12-01T10:00:%02dZ"
    assert most_at_once([(t % 0, t % 5), (t % 0, t % 5), (t % 5, t % 9), (t % 6, t % 9)]) == 2
    assert most_at_once([(t % 0, t % 5), (t % 1, t % 6), (t % 2, t % 3)]) == 3
