"""The final table: one row per host from its host report of the run (pure functions, no I/O), and below it the
"Stage pass" block (each host's window, bytes from the NAS and from peers, the read cap and the rate achieved under
it) for a lane, when peers were used or the reads were capped."""
import contextlib
import re
import shlex
import time

from dgx_stage import use_module_utils

use_module_utils()
from ansible.module_utils.dgx_report import stage_bytes  # noqa: E402
from ansible.module_utils.dgx_status import one_line  # noqa: E402
from ansible.module_utils.dgx_units import human_bytes as units_human_bytes, utc_epoch  # noqa: E402

COLUMNS = (("host", "HOST"), ("run_id", "RUN"), ("status", "STATUS"), ("files", "FILES local/excl"),
           ("copied", "COPIED"), ("repaired", "REPAIRED"), ("nas_corrupt", "NAS CORRUPT"), ("mib_s", "MiB/s"),
           ("verify", "VERIFY"), ("manifest", "MANIFEST local/nas"), ("receipts", "RECEIPTS removed"),
           ("engine", "ENGINE"), ("smoke", "SMOKE"), ("decode", "DECODE tok/s vs floor"))
NONE = "-"
# The plain table's fold: it reads in a 100-column terminal, a pager or a CI log.
PLAIN_WIDTH = 100
MIB = 1024.0 * 1024.0
MARKDOWN_SPECIALS = "\\`*_<>[]|~&"   # ~: GitHub's strikethrough; &: an entity (&lt;) would render as "<"


def human_bytes(count):
    return NONE if count is None else units_human_bytes(count)


def _dict(value):
    # A hand-edited or foreign report must not crash `report`: a part of another shape reads as absent.
    return value if isinstance(value, dict) else {}


def _number(value):
    """An int or float from a report's value ('12' counts as 12); None for anything else (null, text, lists)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    try:
        number = float(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return int(number) if number is not None and number.is_integer() else number


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


def _files_on_disk(rows, check):
    if check:
        return _sum(rows, "files", "local")
    return sum(max(0, (_number(_dict(row.get("files")).get("local")) or 0)
                   - len(row.get("unstaged_paths") if isinstance(row.get("unstaged_paths"), list) else [])
                   - (_number(_dict(row.get("files")).get("dangling")) or 0)) for row in rows)


def _files_rows(report):
    """(the last complete pass's rows, whether no pass that ran is complete) of a real run."""
    ran = [name for name in ("verify", "stage") if _rows(report, name)]
    complete = [name for name in ran if all(isinstance(row.get("files"), dict) for row in _rows(report, name))]
    return (_rows(report, complete[0]) if complete else []), bool(ran) and not complete


def host_figures(report, receipts_removed=None):
    """The raw figures of one host's row (numbers, None when the run did not produce them)."""
    # A check run copies nothing: each pass reports the same would-be copies, so one pass counts, and no rate.
    check = report.get("check_mode") is True or report.get("status") == "check"
    planned = _rows(report, "stage") or _rows(report, "verify") or _rows(report, "preflight")
    copying = planned if check else _rows(report, "stage", "verify")
    # FILES: in --check what the plan stages; in a real run what is on the disk after the last complete pass.
    files_rows, files_unknown = (planned, False) if check else _files_rows(report)
    stage = _rows(report, "stage")
    stage_bytes, stage_s = _sum(stage, "bytes_copied"), sum(_number(r.get("duration_s")) or 0 for r in stage)
    engine = _dict(report.get("engine"))
    manifest = _dict(_dict(engine.get("manifest")).get("counts"))
    bound_corrupt = _dict(engine.get("manifest")).get("nas_corrupt")
    corrupt = set(str(path) for row in copying + _rows(report, "preflight")
                  for path in (row.get("nas_corrupt") if isinstance(row.get("nas_corrupt"), list) else []))
    verify_modes = sorted(set(str(r.get("verify")) for r in _rows(report, "verify") if r.get("verify")))
    return {
        "host": report.get("host"),
        "run_id": report.get("run_id"),
        "status": report.get("status"),
        "files_local": _files_on_disk(files_rows, check) if files_rows else None,
        "files_excluded": _sum(files_rows, "files", "excluded") if files_rows else None,
        "files_unknown": files_unknown,
        "bytes_copied": _sum(copying, "bytes_copied") if copying else None,
        "blobs_repaired": _sum(copying, "blobs", "repaired") if copying else None,
        "nas_corrupt": len(corrupt) if copying or corrupt else None,
        "mib_s": stage_bytes / MIB / stage_s if stage_bytes and stage_s > 0 and not check else None,
        "verify": ",".join(verify_modes) or None,
        "manifest_local": manifest.get("local") if manifest else None,
        "manifest_nas": manifest.get("nas") if manifest else None,
        "manifest_corrupt": len(bound_corrupt) if isinstance(bound_corrupt, list) else 0,
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
    """{column key: one-line text} of one host's row (nothing can forge a row), and its "stage_pass"."""
    f = host_figures(report, receipts_removed)
    cells = {
        "host": str(f["host"] or NONE),
        "run_id": str(f["run_id"] or NONE),
        "status": str(f["status"] or NONE),
        "files": "?" if f["files_unknown"] else _pair(f["files_local"], f["files_excluded"]),
        "copied": human_bytes(f["bytes_copied"]),
        "repaired": NONE if f["blobs_repaired"] is None else str(f["blobs_repaired"]),
        "nas_corrupt": NONE if f["nas_corrupt"] is None else str(f["nas_corrupt"]),
        "mib_s": NONE if f["mib_s"] is None else "%.1f" % f["mib_s"],
        "verify": f["verify"] or NONE,
        "manifest": _pair(f["manifest_local"], f["manifest_nas"])
        + (" (%d NAS CORRUPT bound)" % f["manifest_corrupt"] if f["manifest_corrupt"] else ""),
        "receipts": NONE if f["receipts_removed"] is None else str(f["receipts_removed"]),
        "engine": _engine_health(f["engine"]),
        "smoke": _smoke(f["engine"]),
        "decode": _decode(f["engine"]),
    }
    return dict({key: one_line(text) for key, text in cells.items()}, stage_pass=stage_figures(report))


def _clock(epoch, day):
    """HH:MM:SS (UTC), with the date in front when it is not `day`; '?' when not known."""
    if epoch is None:
        return "?"
    date, clock = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)).split()
    return clock if date == day else date + " " + clock


def stage_window(started, finished, run_started=None):
    """'10:17:43-10:17:52' (UTC), an end on another day than the run's with its date (then ' - ' between)."""
    start, end = utc_epoch(started), utc_epoch(finished)
    if start is None and end is None:
        return NONE
    day = time.strftime("%Y-%m-%d", time.gmtime(utc_epoch(run_started) or (end if start is None else start)))
    ends = (_clock(start, day), _clock(end, day))
    return (" - " if " " in ends[0] + ends[1] else "-").join(ends)


def _count(value):
    """peer_rejected of a stage row: a count, or the list of rejected blobs the module returns."""
    return len(value) if isinstance(value, list) else int(_number(value) or 0)


def stage_figures(report):
    """One host's stage pass (window, bytes from the NAS and from peers, peer blobs rejected), figures and text."""
    rows = _rows(report, "stage")
    check = report.get("check_mode") is True or report.get("status") == "check"
    staged = bool(rows) or utc_epoch(report.get("stage_started")) is not None
    peers, nas = _number(report.get("bytes_from_peers")), _number(report.get("bytes_from_nas"))
    if peers is None and rows:   # a report older than these keys: its stage rows, as dgx_report sums them
        with contextlib.suppress(TypeError, ValueError):   # a hand-edited row's text reads as not given
            nas, peers = stage_bytes(rows)
    nas, peers = (None, None) if check or not staged else (nas or 0, peers or 0)
    rejected = sum(_count(r.get("peer_rejected")) for r in rows)
    cap = max([_number(r.get("max_mib_s")) or 0 for r in rows] or [0])
    read_s = sum(_number(r.get("read_s")) or 0 for r in rows)
    read = _sum(rows, "bytes_read", "local") + _sum(rows, "bytes_read", "nas")
    achieved = read / MIB / read_s if read_s >= 1 and not check else None
    return {"started": report.get("stage_started"), "finished": report.get("stage_finished"),
            "bytes_from_nas": nas, "bytes_from_peers": peers, "peer_rejected": rejected, "staged": staged,
            "window": stage_window(report.get("stage_started"), report.get("stage_finished"), report.get("started")),
            "from_nas": human_bytes(nas), "from_peers": human_bytes(peers), "rejected": str(rejected),
            "max_mib_s": cap, "achieved_mib_s": achieved, "cap": str(cap) if cap else NONE,
            "achieved": NONE if achieved is None else "%.1f" % achieved}


def rank_order(reports):
    """A sort key of the hosts of {host: report}: by rank (none last), then by name."""
    def order(host):
        rank = reports[host].get("rank")
        return (0, rank, host) if isinstance(rank, int) and not isinstance(rank, bool) else (1, 0, host)
    return order


def table_rows(reports, receipts=None):
    """Rows in host order (rank order when the reports have ranks) from {host: report}."""
    return [host_row(dict(reports[h], host=reports[h].get("host") or h), (receipts or {}).get(h))
            for h in sorted(reports, key=rank_order(reports))]


STAGE_TITLE = "Stage pass (UTC)"


def _stage_block(rows):
    """(cells, the lane's total or None) of the "Stage pass" block, or None: shown for a lane, peer blobs or a read
    cap (then with the cap and the read rate achieved under it)."""
    passes = [row["stage_pass"] for row in rows]
    capped = any(p["max_mib_s"] for p in passes)
    if not (any(p["bytes_from_peers"] or p["peer_rejected"] for p in passes) or capped
            or len(rows) > 1 and any(p["staged"] for p in passes)):
        return None
    columns = [("window", "STAGE WINDOW"), ("from_nas", "FROM NAS"), ("from_peers", "FROM PEERS")]
    columns += [("rejected", "PEER REJECTED")] if any(p["peer_rejected"] for p in passes) else []
    columns += [("cap", "CAP MiB/s"), ("achieved", "READ MiB/s")] if capped else []
    cells = [["HOST"] + [title for _key, title in columns]] + [
        [row["host"]] + [row["stage_pass"][key] for key, _title in columns] for row in rows]
    total = None if len(rows) < 2 or all(p["bytes_from_nas"] is None for p in passes) else \
        "lane: %s from the NAS, %s from peers" % (human_bytes(sum(p["bytes_from_nas"] or 0 for p in passes)),
                                                  human_bytes(sum(p["bytes_from_peers"] or 0 for p in passes)))
    return cells, total


def _aligned(cells):
    """Lines of cells, each column as wide as its widest cell."""
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    return ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in cells]


def stage_lines(rows):
    """The plain "Stage pass" block's lines ([] when not shown)."""
    block = _stage_block(rows)
    if not block:
        return []
    cells, total = block
    return [STAGE_TITLE] + _aligned(cells) + ([total] if total else [])


def column_bands(widths, width):
    """COLUMNS folded into bands of at most `width` characters, each led by HOST and at least one more."""
    host, rest = COLUMNS[0], COLUMNS[1:]
    bands, band = [], [host]
    for column in rest:
        if len(band) > 1 and sum(widths[key] + 2 for key, _title in band) + widths[column[0]] > width:
            bands.append(band)
            band = [host]
        band.append(column)
    return bands + [band]


def render_plain(rows, width=PLAIN_WIDTH):
    """Aligned text columns folded to `width` (a log has no terminal width to ask), then the stage pass block."""
    widths = dict((key, max([len(title)] + [len(row[key]) for row in rows])) for key, title in COLUMNS)
    lines = []
    for band in column_bands(widths, width):
        lines += ([""] if lines else []) + _aligned([[title for _key, title in band]] +
                                                    [[row[key] for key, _title in band] for row in rows])
    stage = stage_lines(rows)
    return "\n".join(lines + ([""] + stage if stage else []))


def markdown_escape(text):
    """A table cell: Markdown's specials backslash-escaped, one line."""
    text = " ".join(str(text).split())
    return "".join("\\" + ch if ch in MARKDOWN_SPECIALS else ch for ch in text)


def _markdown_table(header, lines):
    return (["| " + " | ".join(markdown_escape(cell) for cell in header) + " |", "|" + "|".join("---" for _ in header)
             + "|"] + ["| " + " | ".join(markdown_escape(cell) for cell in line) + " |" for line in lines])


def render_markdown(rows, title=None, failures=(), inventory=None):
    """The table in Markdown for a change log, with a title and the failures when given."""
    lines = ["### " + markdown_escape(title), ""] if title else []
    if rows:
        lines += _markdown_table([title for _key, title in COLUMNS], [[row[key] for key, _t in COLUMNS] for row in rows])
    block = _stage_block(rows)
    if block:
        lines += ["", "**%s**" % markdown_escape(STAGE_TITLE), ""] + _markdown_table(block[0][0], block[0][1:])
        lines += ["", markdown_escape(block[1])] if block[1] else []
    if failures:
        lines += [""] + ["- " + markdown_escape(failure_line(failure, inventory)) for failure in failures]
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


def print_table(console, rows, title=None, plain_width=None):
    """The rich table when it fits (rich would squeeze the host names away), else the plain one folded at
    plain_width (a log or a pipe) or the terminal's width."""
    if plain_width or console.width < rich_table_min_width(rows):
        # soft_wrap: the lines as render_plain made them (the terminal wraps a long one, rich would reflow it)
        text = render_plain(rows, plain_width or console.width)
        console.print(title + "\n" + text if title else text, markup=False, highlight=False, soft_wrap=True)
        return
    console.print(rich_table(rows, title=title))
    stage = stage_lines(rows)
    if stage:
        console.print("\n".join([""] + stage), markup=False, highlight=False, soft_wrap=True)


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


def with_inventory(text, inventory):
    """text with the run's -i INVENTORY in each `dgx-stage SUBCOMMAND` fix (the hosts do not know it)."""
    if not inventory:
        return text
    return re.sub(r"`dgx-stage (?!report\b)([a-z-]+)",
                  lambda match: "`dgx-stage %s -i %s" % (match.group(1), shlex.quote(inventory)), text)


def failure_line(failure, inventory=None):
    """'host H failed in play P, task T: msg' (or unreachable), one line; the fixes msg gives run on `inventory`."""
    what = "unreachable" if failure.get("unreachable") else "failed"
    msg = with_inventory(" ".join(str(failure.get("msg") or "").split()), inventory)
    # A hand-edited report or run.json may hold any JSON there: each part reads as text, or as absent.
    return one_line("host %s %s in play %s, task %s: %s" % (failure.get("host"), what, failure.get("play") or "?",
                                                            failure.get("task") or "?", msg))
