"""Sizes and times as the messages, the progress file and the reports write them.
"""
import calendar
import time

UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def human_bytes(count):
    """Binary units, one decimal: 17 B, 3.2 KiB, 812.0 MiB, 12.3 GiB, 1.2 TiB (None reads as 0 B)."""
    count = count or 0
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return ("%d %s" % (count, unit)) if unit == "B" else ("%.1f %s" % (count, unit))
        count /= 1024.0


def utc_text(epoch=None):
    """ISO 8601 UTC, to the second: 2026-09-27T03:14:15Z (now when epoch is None)."""
    return time.strftime(UTC_FORMAT, time.gmtime(epoch))


def utc_epoch(text):
    """Epoch seconds of an ISO 8601 UTC text (2026-09-27T03:14:15Z, a fraction ignored), or None."""
    try:
        return calendar.timegm(time.strptime(str(text).split(".")[0].rstrip("Z") + "Z", UTC_FORMAT))
    except (TypeError, ValueError):
        return None


def plain_number(value):
    """30.78 -> '30.78', 100000.0 -> '100000' (floors and rates as an operator wrote them)."""
    return ("%.2f" % float(value)).rstrip("0").rstrip(".")
