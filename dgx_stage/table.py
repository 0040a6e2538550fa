"""The final table: one row per host from its host report of the run (pure functions, no I/O).

A host report (module_utils/dgx_report.py) holds this run's passes (per repo mirror results), the engine's
rows (manifest counts, ready state, smoke, decode with its floor). Receipts removed are not in the report:
the front end takes them from the engine_receipts results of the run (recorded in run.json).
"""

COLUMNS = (
    ("host", "HOST"),
    ("run_id", "RUN"),
    ("status", "STATUS"),
    ("files", "FILES local/excl"),
    ("copied", "COPIED"),
    ("repaired", "REPAIRED"),
    ("nas_corrupt", "NAS CORRUPT"),
    ("mib_s", "MiB/s"),
    ("verify", "VERIFY"),
    ("manifest", "MANIFEST local/nas"),
    ("receipts", "RECEIPTS removed"),
    ("engine", "ENGINE"),
    ("smoke", "SMOKE"),
    ("decode", "DECODE tok/s vs floor"),
)
NONE = "-"
MIB = 1024.0 * 1024.0
MARKDOWN_SPECIALS = "\\`*_<>[]|~&"   # ~: GitHub's strikethrough; &: an entity (&lt;) would render as "<"


def human_bytes(count):
    """1536 -> '1.5 KiB'; whole bytes below 1 KiB."""
    if count is None:
        return NONE
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return "%d B" % count if unit == "B" else "%.1f %s" % (value, unit)
        value /= 1024


def _dict(value):
    """A report's part as a dict ({} for anything else: a hand-edited or foreign file must not crash report)."""
    return value if isinstance(value, dict) else {}


def _number(value):
    """An int or float from a report's value ('12' counts as 12); None for anything else (null, text, lists)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if number.is_integer() else number
    return None


def _rows(report, *names):
    passes = _dict(report.get("passes"))
    return [row for name in names for row in (passes.get(name) if isinstance(passes.get(name), list) else [])
            if isinstance(row, dict)]


def _sum(rows, *path):
    total = 0
    for row in rows:
        value = row
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        total += _number(value) or 0
    return total


def host_figures(report, receipts_removed=None):
    """The raw figures of one host's row (numbers, None when the run did not produce them)."""
    # A check run copies nothing: each pass reports what it would copy, the same bytes again (stage's
    # would-be copies are still missing when verify looks), so one pass counts, and there is no rate.
    check = report.get("check_mode") is True or report.get("status") == "check"
    copying = (_rows(report, "stage") or _rows(report, "verify") or _rows(report, "preflight")) if check \
        else _rows(report, "stage", "verify")
    files_rows = _rows(report, "stage") or _rows(report, "verify") or _rows(report, "preflight")
    stage = _rows(report, "stage")
    stage_bytes, stage_s = _sum(stage, "bytes_copied"), sum(_number(r.get("duration_s")) or 0 for r in stage)
    engine = _dict(report.get("engine"))
    manifest = _dict(_dict(engine.get("manifest")).get("counts"))
    corrupt = set(str(path) for row in copying + _rows(report, "preflight")
                  for path in (row.get("nas_corrupt") if isinstance(row.get("nas_corrupt"), list) else []))
    verify_modes = sorted(set(str(r.get("verify")) for r in _rows(report, "verify") if r.get("verify")))
    return {
        "host": report.get("host"),
        "run_id": report.get("run_id"),
        "status": report.get("status"),
        "files_local": _sum(files_rows, "files", "local") if files_rows else None,
        "files_excluded": _sum(files_rows, "files", "excluded") if files_rows else None,
        "bytes_copied": _sum(copying, "bytes_copied") if copying else None,
        "blobs_repaired": _sum(copying, "blobs", "repaired") if copying else None,
        "nas_corrupt": len(corrupt) if copying or corrupt else None,
        "mib_s": stage_bytes / MIB / stage_s if stage_bytes and stage_s > 0 and not check else None,
        "verify": ",".join(verify_modes) or None,
        "manifest_local": manifest.get("local") if manifest else None,
        "manifest_nas": manifest.get("nas") if manifest else None,
        "receipts_removed": len(receipts_removed) if receipts_removed is not None else None,
        "engine": engine,
    }


def _engine_health(engine):
    ready = _dict(engine.get("ready"))
    if ready.get("state"):
        return str(ready["state"]) + (" (restarted)" if engine.get("started") else "")
    if engine.get("runtime"):
        return "started" if engine.get("started") else "unchanged"
    return NONE


def _smoke(engine):
    smoke = _dict(engine.get("smoke"))
    if not smoke:
        return NONE
    if "passed" not in smoke:
        return "error: %s" % (smoke.get("error") or "no answer")
    text = "ok" if smoke["passed"] else "FAILED"
    duration = _number(smoke.get("duration_s"))
    return text + (" (%.1f s)" % duration if duration is not None else "")


def _decode(engine):
    """'35.0 (e2e 34.2), floor 30.78: ok': both rates must reach the floor, and the stream be complete."""
    decode = _dict(engine.get("decode"))
    if not decode:
        return NONE
    rate = _number(decode.get("decode_tok_s"))
    if rate is None:
        return "error: %s" % (decode.get("error") or "no rate")
    text = "%.1f" % rate
    if _number(decode.get("e2e_tok_s")) is not None:
        text += " (e2e %.1f)" % _number(decode["e2e_tok_s"])
    if decode.get("floor") is None:
        return text
    verdict = "ok" if decode.get("passed") else ("incomplete" if decode.get("complete") is False else "BELOW")
    return "%s, floor %s: %s" % (text, decode["floor"], verdict)


def _pair(a, b):
    return NONE if a is None and b is None else "%s/%s" % (NONE if a is None else a, NONE if b is None else b)


def host_row(report, receipts_removed=None):
    """{column key: text} of one host's row."""
    f = host_figures(report, receipts_removed)
    return {
        "host": str(f["host"] or NONE),
        "run_id": str(f["run_id"] or NONE),
        "status": str(f["status"] or NONE),
        "files": _pair(f["files_local"], f["files_excluded"]),
        "copied": human_bytes(f["bytes_copied"]),
        "repaired": NONE if f["blobs_repaired"] is None else str(f["blobs_repaired"]),
        "nas_corrupt": NONE if f["nas_corrupt"] is None else str(f["nas_corrupt"]),
        "mib_s": NONE if f["mib_s"] is None else "%.1f" % f["mib_s"],
        "verify": f["verify"] or NONE,
        "manifest": _pair(f["manifest_local"], f["manifest_nas"]),
        "receipts": NONE if f["receipts_removed"] is None else str(f["receipts_removed"]),
        "engine": _engine_health(f["engine"]),
        "smoke": _smoke(f["engine"]),
        "decode": _decode(f["engine"]),
    }


def table_rows(reports, receipts=None):
    """Rows in host order (rank order when the reports have ranks) from {host: report}."""
    receipts = receipts or {}
    reports = dict((h, r if isinstance(r, dict) else {"host": h, "status": "unreadable: not a JSON object"})
                   for h, r in reports.items())
    order = sorted(reports, key=lambda h: (reports[h].get("rank") if isinstance(reports[h].get("rank"), int)
                                           else 1 << 30, h))
    return [host_row(dict(reports[h], host=reports[h].get("host") or h), receipts.get(h)) for h in order]


def render_plain(rows):
    """Aligned text columns, no escape codes."""
    widths = dict((key, max([len(title)] + [len(row[key]) for row in rows])) for key, title in COLUMNS)
    lines = ["  ".join(title.ljust(widths[key]) for key, title in COLUMNS).rstrip()]
    for row in rows:
        lines.append("  ".join(row[key].ljust(widths[key]) for key, _title in COLUMNS).rstrip())
    return "\n".join(lines)


def markdown_escape(text):
    """A table cell: Markdown's specials backslash-escaped, one line."""
    text = " ".join(str(text).split())
    return "".join("\\" + ch if ch in MARKDOWN_SPECIALS else ch for ch in text)


def render_markdown(rows, title=None, failures=()):
    """A Markdown table for a change log (optionally a title line and the failures as a list)."""
    lines = []
    if title:
        lines += ["### " + markdown_escape(title), ""]
    lines.append("| " + " | ".join(markdown_escape(title) for _key, title in COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for row in rows:
        lines.append("| " + " | ".join(markdown_escape(row[key]) for key, _title in COLUMNS) + " |")
    if failures:
        lines.append("")
        for failure in failures:
            lines.append("- " + markdown_escape(failure_line(failure)))
    return "\n".join(lines)


NO_WRAP = ("host", "run_id", "status")


def rich_table_min_width(rows):
    """The narrowest terminal the rich table fits without cutting a word (or a host, run id, status)."""
    total = 1
    for key, title in COLUMNS:
        cells = [title] + [row[key] for row in rows]
        words = cells if key in NO_WRAP else [w for cell in cells for w in cell.split()]
        total += max(len(w) for w in words) + 3   # a padded cell and its border
    return total


def render_vertical(rows):
    """One block per host, a line per column: the table for a terminal too narrow for its columns."""
    width = max(len(title) for _key, title in COLUMNS)
    lines = []
    for row in rows:
        lines += [("%s:" % title).ljust(width + 1) + " " + row[key] if key != "host" else row[key]
                  for key, title in COLUMNS]
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def print_table(console, rows, title=None):
    """The rich table on a terminal wide enough for it (rich would squeeze the host names away, to nothing
    in 40 columns), else the vertical blocks."""
    if console.width >= rich_table_min_width(rows):
        console.print(rich_table(rows, title=title))
    else:
        if title:
            console.print(title, markup=False, highlight=False)
        console.print(render_vertical(rows), markup=False, highlight=False)


def rich_table(rows, title=None):
    """The same table for a terminal (rich)."""
    from rich.table import Table
    from rich.text import Text
    table = Table(title=Text(title) if title is not None else None)   # cells are text, not rich markup
    for key, title_text in COLUMNS:
        table.add_column(title_text, no_wrap=key in NO_WRAP,
                         justify="right" if key in ("copied", "repaired", "nas_corrupt", "mib_s", "receipts") else "left")
    for row in rows:
        style = None if row["status"] in ("ok", "check") else "red"
        table.add_row(*[Text(row[key]) for key, _t in COLUMNS], style=style)
    return table


def failure_line(failure):
    """'host H failed in play P, task T: msg' (or unreachable)."""
    what = "unreachable" if failure.get("unreachable") else "failed"
    return "host %s %s in play %s, task %s: %s" % (failure["host"], what, failure.get("play") or "?",
                                                   failure.get("task") or "?", failure.get("msg") or "")
