"""Test oracles read from a lane run's host reports, shared by the suites."""


def most_at_once(windows):
    """The largest number of [started, finished] windows (ISO 8601 UTC strings, which sort in time order) open
    at one instant. The reports give whole seconds, so a window ending in the second another starts does not
    count as overlapping it: a host of the next wave starts after the last host of the previous one ended."""
    events = sorted([(finished, 0) for _s, finished in windows] + [(started, 1) for started, _f in windows])
    open_now = most = 0
    for _when, starts in events:
        open_now += 1 if starts else -1
        most = max(most, open_now)
    return most
