"""dgx_stage.table: the final table's figures from real host reports (tests/unit/fixtures/frontend: a demo
run that copied both repos, a host that failed in preflight), the engine rows as module_utils/dgx_decode
shapes them, and the plain, Markdown and rich renderings."""
import io
import json
import os
import sys

from ansible.module_utils.dgx_decode import probe_report

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this tree's
from dgx_stage import table  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "frontend")
DECODE_RESULT = {"model": "m", "tokens": 400, "token_source": "usage", "prompt_tokens": 487, "ttft_s": 0.3,
                 "decode_s": 11.4, "decode_tok_s": 35.0, "e2e_tok_s": 34.2, "duration_s": 11.8,
                 "finish_reason": "length", "max_tokens": 400, "complete": True, "problems": []}
SMOKE_RESULT = {"model": "m", "question": "127*89?", "expected": "11303", "answer": "11303", "passed": True,
                "duration_s": 1.25}


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return json.load(handle)


def test_files_count_what_is_on_the_disk_not_what_a_plan_or_a_failed_pass_claimed():
    report = fixture("report-stage-ok.json")
    passes = report["passes"]
    # An interrupted stage: its job never returned a row; the preflight's plan is not on the disk.
    interrupted = dict(report, passes={"preflight": passes["preflight"]})
    assert table.host_figures(interrupted)["files_local"] is None
    assert table.host_row(interrupted)["files"].startswith("-")
    # A failed verify: its row names the files it found not staged, and a dangling entry.
    verify = [dict(row) for row in passes["verify"]]
    verify[0] = dict(verify[0], unstaged_paths=["model-00001.safetensors", "config.json"],
                     files=dict(verify[0]["files"], dangling=1))
    failed = dict(report, status="failed", passes=dict(passes, verify=verify))
    assert table.host_figures(failed)["files_local"] == 17 - 3
    # --check: the plan is what it would stage.
    check = dict(report, status="check", check_mode=True, passes={"preflight": passes["preflight"]})
    assert table.host_figures(check)["files_local"] == sum(r["files"]["local"] for r in passes["preflight"])


def test_files_of_a_pass_with_a_repo_left_without_figures_come_from_the_last_complete_pass_or_read_unknown():
    # A verify whose main repo's lock was held by another run: that repo's row is failed, without figures; the
    # drafter's row alone would say 4/0 with 17/5 on the disk.
    report = fixture("report-stage-ok.json")
    passes = report["passes"]
    drafter = [row for row in passes["verify"] if row["files"]["local"] == 4]
    lock_held = [{"repo_id": "org/main", "repo_type": "model", "status": "failed", "check_mode": False}] + drafter
    failed = dict(report, status="failed", passes=dict(passes, verify=lock_held))
    assert table.host_row(failed)["files"] == "17/5"            # this run's stage pass
    verify_only = dict(failed, passes={"verify": lock_held})
    assert table.host_row(verify_only)["files"] == "?"
    # A repo's row saying failed with its figures counts; so does every row of a pass that failed later.
    unstaged = [dict(row, status="failed", unstaged_paths=["config.json"]) for row in passes["verify"][:1]]
    assert table.host_row(dict(verify_only, passes={"verify": unstaged + drafter}))["files"] == "16/5"
    assert table.host_row(dict(verify_only, passes={"verify": drafter}))["files"] == "4/0"


def test_a_staged_hosts_row_has_the_reports_figures():
    report = fixture("report-stage-ok.json")
    stage = report["passes"]["stage"]
    figures = table.host_figures(report, receipts_removed=["/c/a", "/c/b", "/c/c"])
    # Files of the stage pass: 13 + 4 local, the 5 page15 files excluded.
    assert (figures["files_local"], figures["files_excluded"]) == (17, 5)
    # Bytes copied by the stage and verify passes (the preflight plan is not a copy): the NAS bytes.
    assert figures["bytes_copied"] == sum(r["bytes_copied"] for r in stage) == report["bytes_from_nas"] == 50360327
    assert figures["blobs_repaired"] == 0 and figures["nas_corrupt"] == 0
    # The stage pass's rate: its bytes over the module's own time.
    assert abs(figures["mib_s"] - 50360327 / 1048576.0 / (0.198 + 0.101)) < 1e-9
    assert figures["verify"] == "sample" and (figures["manifest_local"], figures["manifest_nas"]) == (17, 1)
    assert figures["receipts_removed"] == 3
    row = table.host_row(report, ["/c/a", "/c/b", "/c/c"])
    assert row.pop("stage_pass") == table.stage_figures(report)
    assert row == {"host": "localhost", "run_id": "20261201T101737Z-ed44", "status": "ok", "files": "17/5",
                   "copied": "48.0 MiB", "repaired": "0", "nas_corrupt": "0", "mib_s": "160.6", "verify": "sample",
                   "manifest": "17/1", "receipts": "3", "engine": "-", "smoke": "-", "decode": "-"}


def test_receipts_unknown_is_a_dash_and_none_removed_is_zero():
    report = fixture("report-stage-ok.json")
    assert table.host_row(report)["receipts"] == "-"
    assert table.host_row(report, [])["receipts"] == "0"


def test_a_host_that_failed_in_preflight_shows_failed_and_no_figures():
    row = table.host_row(fixture("report-preflight-failed.json"))
    assert row["host"] == "rank1" and row["status"] == "failed"
    assert [row[k] for k in ("files", "copied", "repaired", "nas_corrupt", "mib_s", "verify", "manifest")] == ["-"] * 7


def test_repairs_and_nas_corruption_are_counted_over_the_passes():
    report = fixture("report-stage-ok.json")
    report["passes"]["verify"][0]["blobs"]["repaired"] = 2
    report["passes"]["verify"][0]["bytes_copied"] = 2048
    report["passes"]["stage"][0]["nas_corrupt"] = ["model-00002-of-00006.safetensors"]
    report["passes"]["verify"][0]["nas_corrupt"] = ["model-00002-of-00006.safetensors", "config.json"]
    figures = table.host_figures(report)
    assert figures["blobs_repaired"] == 2 and figures["nas_corrupt"] == 2
    assert figures["bytes_copied"] == 50360327 + 2048


def test_nas_files_bound_although_found_corrupt_are_said_in_the_manifest_column():
    report = fixture("report-stage-ok.json")
    report["engine"]["manifest"] = {"counts": {"local": 0, "nas": 18, "total": 18}, "bind_from": "nas",
                                    "nas_corrupt": [{"repo_id": "org/m", "path": "a", "blob": "b" * 64}]}
    assert table.host_row(report)["manifest"] == "0/18 (1 NAS CORRUPT bound)"
    report["engine"]["manifest"]["nas_corrupt"] = []
    assert table.host_row(report)["manifest"] == "0/18"


def test_engine_columns_from_the_rows_dgx_probe_shapes():
    report = fixture("report-stage-ok.json")
    report["engine"].update(runtime="podman", started=True, ready={"models": ["m"], "state": "ready", "rounds": 3},
                            smoke=probe_report("smoke", SMOKE_RESULT),
                            decode=probe_report("decode", DECODE_RESULT, 30.78))
    row = table.host_row(report)
    assert row["engine"] == "ready (restarted)" and row["smoke"] == "ok (1.2 s)"
    assert row["decode"] == "35.0 (e2e 34.2), floor 30.78: ok"
    report["engine"]["decode"] = probe_report("decode", DECODE_RESULT, 100000)
    assert table.host_row(report)["decode"] == "35.0 (e2e 34.2), floor 100000.0: BELOW"
    report["engine"]["decode"] = probe_report("decode", dict(DECODE_RESULT, complete=False), 30.78)
    assert table.host_row(report)["decode"].endswith(": incomplete")
    report["engine"].update(smoke={"error": "connection refused"}, decode={"error": "connection refused"})
    row = table.host_row(report)
    assert row["smoke"] == "error: connection refused" and row["decode"] == "error: connection refused"
    report["engine"].update(started=False, ready={"models": ["m"], "state": "dead"})
    assert table.host_row(report)["engine"] == "dead"


def test_rows_are_in_rank_order_and_plain_text_is_aligned_without_escapes():
    ok, failed = fixture("report-stage-ok.json"), fixture("report-preflight-failed.json")
    ok["rank"], failed["rank"] = 1, 0
    rows = table.table_rows({"localhost": ok, "rank1": failed}, {"localhost": []})
    assert [r["host"] for r in rows] == ["rank1", "localhost"]
    text = table.render_plain(rows)
    lines = text.splitlines()
    assert lines[7:9] == ["", "Stage pass (UTC)"] and "\x1b" not in text   # two hosts: the block below
    assert lines[0].startswith("HOST       RUN ") and lines[2].startswith("localhost  20261201T101737Z-ed44  ok ")
    # Every column starts at the same offset on every line.
    start = lines[0].index("COPIED")
    assert lines[2][start:].startswith("48.0 MiB") and lines[1][start:].startswith("-")


def test_markdown_escapes_the_specials_in_every_cell():
    assert table.markdown_escape("a|b*c_d`e<f>g[h]i\\j") == "a\\|b\\*c\\_d\\`e\\<f\\>g\\[h\\]i\\\\j"
    assert table.markdown_escape("two\nlines") == "two lines"
    assert table.markdown_escape("~/x ~~gone~~ &lt;b&gt;") == "\\~/x \\~\\~gone\\~\\~ \\&lt;b\\&gt;"
    report = fixture("report-stage-ok.json")
    report["host"] = "node|<1>"
    md = table.render_markdown([table.host_row(report)], title="dgx-stage run x",
                               failures=[{"host": "n*1", "play": "stage", "task": "Mirror | x", "msg": "[bad]"}])
    lines = md.splitlines()
    assert lines[0] == "### dgx-stage run x"
    assert lines[2].startswith("| HOST | RUN | STATUS | FILES local/excl | COPIED |") and lines[3].startswith("|---|")
    assert lines[4].startswith("| node\\|\\<1\\> | 20261201T101737Z-ed44 | ok | 17/5 | 48.0 MiB |")
    assert lines[4].count(" | ") == len(table.COLUMNS) - 1   # the escaped | does not split the row
    assert lines[-1] == "- host n\\*1 failed in play stage, task Mirror \\| x: \\[bad\\]"


def test_rich_table_renders_every_column_and_row():
    from rich.console import Console
    out = io.StringIO()
    Console(file=out, width=250, force_terminal=False).print(
        table.rich_table([table.host_row(fixture("report-stage-ok.json"))], title="t"))
    text = out.getvalue()
    for _key, title in table.COLUMNS:
        assert title in text
    assert "20261201T101737Z-ed44" in text and "48.0 MiB" in text


def test_human_bytes():
    assert [table.human_bytes(n) for n in (None, 0, 1023, 1024, 1536, 50360327, 3 << 40)] == [
        "-", "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "48.0 MiB", "3.0 TiB"]


def test_a_report_with_strings_nulls_or_wrong_shapes_renders_instead_of_crashing():
    # `report` reads files from disk: a hand-edited or foreign report crashed it with a TypeError.
    report = fixture("report-stage-ok.json")
    for row in report["passes"]["stage"]:
        row["bytes_copied"] = str(row["bytes_copied"])          # numbers as text count
        row["duration_s"] = None
        row["blobs"]["repaired"] = "n/a"                        # text that is no number does not
        row["nas_corrupt"] = "none"
    report["engine"] = {"ready": {"state": 1}, "smoke": "ok", "decode": {"decode_tok_s": "35", "e2e_tok_s": [],
                                                                       "floor": 30, "passed": True}}
    row = table.host_row(report)
    assert row["copied"] == table.human_bytes(sum(int(r["bytes_copied"]) for r in report["passes"]["stage"]))
    assert (row["repaired"], row["nas_corrupt"], row["mib_s"]) == ("0", "0", "-")
    assert (row["engine"], row["smoke"], row["decode"]) == ("1", "-", "35.0, floor 30: ok")
    # (a file holding no JSON object never reaches the table: test_frontend_cli's garbage report files test)
    for bad in ({"passes": "x", "engine": "x", "status": 5}, {"passes": {"stage": [{"files": "x"}]}}):
        rows = table.table_rows({"h": bad})
        assert rows[0]["host"] == "h" and table.render_plain(rows) and table.render_markdown(rows)


def test_control_characters_in_names_and_engine_errors_are_escaped_in_every_rendering():
    # A host name, a repo's file name or an engine's HTTP error body must not forge a row or drive the terminal.
    from rich.console import Console
    report = dict(fixture("report-stage-ok.json"), host="dgx\x1b[2J1\nHOST  fake  ok",
                  engine={"smoke": {"error": "HTTP 500: \x1b]0;title\x07\x9b31m"}})
    rows = table.table_rows({report["host"]: report})
    assert rows[0]["host"] == "dgx\\x1b[2J1\\nHOST  fake  ok"
    assert rows[0]["smoke"] == "error: HTTP 500: \\x1b]0;title\\x07\\x9b31m"
    out = io.StringIO()
    table.print_table(Console(file=out, width=400, force_terminal=True), rows)
    for text in (table.render_plain(rows), table.render_markdown(rows), out.getvalue().replace("\x1b[", ""),
                 table.failure_line({"host": "h\nx", "play": "smoke", "task": "t", "msg": "a\x1b[2Jb\r\nc"})):
        assert not any(ch in text for ch in "\x1b\x07\r\x9b"), repr(text)
    assert table.render_plain(rows).count("\n") == table.render_plain(table.table_rows({"h": report})).count("\n")
    assert table.failure_line({"host": "h", "msg": "a\x1b[2Jb"}) == "host h failed in play ?, task ?: a\\x1b[2Jb"


def test_a_failure_whose_fields_are_not_text_reads_them_as_text_or_absent():
    # A hand-edited report's failed_msg of 7 crashed `report` with a TypeError in the failure line.
    for msg, said in ((7, "7"), (True, "True"), ({"a": 1}, "{'a': 1}"), ([], ""), (None, "")):
        failure = {"host": "h", "play": ["p"], "task": 5, "msg": msg}
        assert table.failure_line(failure, "inv") == "host h failed in play ['p'], task 5: %s" % said
        assert table.render_markdown([], failures=[failure], inventory="inv")


def test_a_check_run_counts_the_would_be_copies_once_and_shows_no_rate():
    # In --check every pass reports what it would copy: stage's copies are still missing when verify looks,
    # so the table said twice the bytes, and a MiB/s for nothing copied.
    report = fixture("report-stage-ok.json")
    report["check_mode"], report["status"] = True, "check"
    for row in report["passes"]["stage"]:
        row.update(check_mode=True, status="check")
    report["passes"]["verify"] = [dict(row) for row in report["passes"]["stage"]]
    row = table.host_row(report)
    assert row["status"] == "check" and row["mib_s"] == "-"
    assert row["copied"] == table.human_bytes(sum(r["bytes_copied"] for r in report["passes"]["stage"]))
    del report["passes"]["stage"], report["passes"]["verify"]   # --tags preflight: its would-be copies
    assert table.host_row(report)["copied"] == table.human_bytes(
        sum(r["bytes_copied"] for r in report["passes"]["preflight"]))


def test_a_narrow_terminal_gets_the_plain_table_folded_at_its_width_instead_of_a_squeezed_one():
    # rich squeezed 14 columns into 40: the HOST column to nothing and the status to "c…".
    from rich.console import Console
    rows = table.table_rows({"dgx1": fixture("report-stage-ok.json"), "dgx2": fixture("report-preflight-failed.json")})
    for width, wide in ((40, False), (table.rich_table_min_width(rows) - 1, False),
                        (table.rich_table_min_width(rows), True)):
        out = io.StringIO()
        table.print_table(Console(file=out, width=width, force_terminal=False), rows, title="t")
        text = out.getvalue()
        assert ("┃" in text) == wide, width
        for row in rows:
            assert row["host"] in text.split() if not wide else row["host"] in text
            assert row["status"] in text and row["run_id"] in text
        if not wide:
            assert text == "t\n" + table.render_plain(rows, width) + "\n", width
            main = text.split("\nStage pass")[0].splitlines()
            assert all(len(line) <= width for line in main) and len(main) > 3 * len(rows), text


# --- the stage pass block: each host's own window and where its bytes came from -------------------------------

def lane_reports(world_size=4, readers=2):
    """A lane of hosts staging in waves of `readers` (rank order) with fan-out: rank 0 reads everything from the
    NAS, the later ranks take the shared part from peers and read only their own part from the NAS; rank 3
    rejected one peer blob (refetched from the NAS)."""
    reports = {}
    for rank in range(world_size):
        report = fixture("report-stage-ok.json")
        wave = rank // readers
        nas, peers = (48 * 2 ** 20, 0) if rank == 0 else (8 * 2 ** 20, 40 * 2 ** 20)
        report.update(host="dgx%d" % (rank + 1), rank=rank, world_size=world_size, bytes_from_nas=nas,
                      bytes_from_peers=peers, stage_started="2026-12-01T10:%02d:05Z" % (18 + 2 * wave),
                      stage_finished="2026-12-01T10:%02d:59Z" % (19 + 2 * wave))
        report["passes"]["stage"][0].update(bytes_from_nas=nas, bytes_from_peers=peers,
                                            peer_rejected=1 if rank == 3 else 0)
        reports[report["host"]] = report
    return reports


def test_a_lane_shows_each_hosts_stage_window_and_bytes_from_the_nas_and_from_peers():
    rows = table.table_rows(lane_reports())
    text = table.render_plain(rows)
    main, block = text.split("\n\nStage pass (UTC)\n")
    assert block.splitlines() == [
        "HOST  STAGE WINDOW       FROM NAS  FROM PEERS  PEER REJECTED",
        "dgx1  10:18:05-10:19:59  48.0 MiB  0 B         0",
        "dgx2  10:18:05-10:19:59  8.0 MiB   40.0 MiB    0",
        "dgx3  10:20:05-10:21:59  8.0 MiB   40.0 MiB    0",
        "dgx4  10:20:05-10:21:59  8.0 MiB   40.0 MiB    1",
        "lane: 72.0 MiB from the NAS, 120.0 MiB from peers"]
    # The main table above it: every host in each of its bands.
    assert [line.split()[0] for line in main.splitlines() if line and not line.startswith("HOST ")] == \
        ["dgx1", "dgx2", "dgx3", "dgx4"] * len(main.split("\n\n"))


def test_the_rejected_column_only_when_a_peer_blob_was_rejected_and_the_date_only_when_not_the_runs():
    reports = lane_reports(world_size=2)
    reports["dgx2"]["passes"]["stage"][0]["peer_rejected"] = 0
    # dgx2's stage ran past midnight of the run's day (the run started 2026-12-01).
    reports["dgx2"].update(stage_started="2026-12-01T23:59:30Z", stage_finished="2026-12-02T00:01:02Z")
    lines = table.stage_lines(table.table_rows(reports))
    assert lines[1] == "HOST  STAGE WINDOW                    FROM NAS  FROM PEERS"
    assert lines[2] == "dgx1  10:18:05-10:19:59               48.0 MiB  0 B"
    assert lines[3] == "dgx2  23:59:30 - 2026-12-02 00:01:02  8.0 MiB   40.0 MiB"
    assert table.stage_window("2026-12-02T00:00:01Z", None, "2026-12-01T23:59:00Z") == "2026-12-02 00:00:01 - ?"
    assert table.stage_window(None, None, "2026-12-01T23:59:00Z") == "-"


def test_a_single_host_staging_from_the_nas_prints_the_table_alone_as_before():
    rows = table.table_rows({"localhost": fixture("report-stage-ok.json")}, {"localhost": []})
    assert table.stage_lines(rows) == []
    # Byte for byte what the runbooks quote (docs/runbooks/*.md): the header and the host's line, nothing more.
    assert table.render_plain(rows).splitlines() == [
        "HOST       RUN                    STATUS  FILES local/excl  COPIED    REPAIRED  NAS CORRUPT  MiB/s",
        "localhost  20261201T101737Z-ed44  ok      17/5              48.0 MiB  0         0            160.6",
        "",
        "HOST       VERIFY  MANIFEST local/nas  RECEIPTS removed  ENGINE  SMOKE  DECODE tok/s vs floor",
        "localhost  sample  17/1                0                 -       -      -"]
    assert table.render_markdown(rows, title="t").splitlines()[-1] == (
        "| localhost | 20261201T101737Z-ed44 | ok | 17/5 | 48.0 MiB | 0 | 0 | 160.6 | sample | 17/1 | 0 | - | - | - |")
    # Peer bytes (or a rejection) on one host are worth showing even alone.
    report = fixture("report-stage-ok.json")
    report["passes"]["stage"][1]["peer_rejected"] = 2
    lines = table.stage_lines(table.table_rows({"localhost": report}))
    assert lines[2] == "localhost  10:17:43-10:17:52  48.0 MiB  0 B         2"


def test_a_capped_stage_shows_the_cap_and_the_rate_achieved_under_it_even_on_one_host():
    report = fixture("report-stage-ok.json")
    main, drafter = report["passes"]["stage"][:2]
    main.update(max_mib_s=8, read_s=5.5, bytes_read={"local": 0, "nas": 44 * 2 ** 20})
    drafter.update(max_mib_s=8, read_s=0.5, bytes_read={"local": 0, "nas": 4 * 2 ** 20})
    lines = table.stage_lines(table.table_rows({"localhost": report}))
    assert lines[1] == "HOST       STAGE WINDOW       FROM NAS  FROM PEERS  CAP MiB/s  READ MiB/s"
    assert lines[2] == "localhost  10:17:43-10:17:52  48.0 MiB  0 B         8          8.0"
    # Under a second of reading there is no rate to show; a check run reads nothing.
    main["read_s"] = drafter["read_s"] = 0.4
    assert table.stage_lines(table.table_rows({"localhost": report}))[2].endswith("8          -")
    report["status"] = "check"
    assert table.stage_lines(table.table_rows({"localhost": report}))[2].split()[-2:] == ["8", "-"]


def test_hosts_that_did_not_stage_show_dashes_and_a_lane_that_did_not_stage_shows_no_block():
    reports = lane_reports(world_size=2)
    reports["dgx2"] = fixture("report-preflight-failed.json")
    lines = table.stage_lines(table.table_rows(reports))
    assert lines[3] == "rank1  -                  -         -"
    # A serve run of two hosts: no stage pass in it, no block.
    for report in reports.values():
        report.update(stage_started=None, stage_finished=None)
        report["passes"] = {}
    assert table.stage_lines(table.table_rows(reports)) == []


def test_a_check_run_read_nothing_and_an_older_report_is_read_from_its_stage_rows():
    reports = lane_reports(world_size=2)
    for report in reports.values():
        report.update(check_mode=True, status="check")
    lines = table.stage_lines(table.table_rows(reports))
    assert lines[2] == "dgx1  10:18:05-10:19:59  -         -" and len(lines) == 4   # no lane total either
    # Without the top-level keys (a report from before them): the stage rows, bytes_copied from the NAS.
    reports = lane_reports(world_size=2)
    for report in reports.values():
        del report["bytes_from_nas"], report["bytes_from_peers"]
    del reports["dgx1"]["passes"]["stage"][0]["bytes_from_nas"]
    figures = table.stage_figures(reports["dgx1"])
    assert figures["bytes_from_nas"] == 50360327 and figures["bytes_from_peers"] == 0
    assert table.stage_figures(reports["dgx2"])["bytes_from_peers"] == 40 * 2 ** 20


def test_markdown_has_the_stage_pass_as_a_second_table():
    md = table.render_markdown(table.table_rows(lane_reports()), title="run x",
                               failures=[{"host": "dgx4", "play": "verify", "task": "t", "msg": "m"}])
    lines = md.splitlines()
    at = lines.index("**Stage pass (UTC)**")
    assert lines[at - 1] == "" and lines[at + 1] == ""
    assert lines[at + 2] == "| HOST | STAGE WINDOW | FROM NAS | FROM PEERS | PEER REJECTED |"
    assert lines[at + 3] == "|---|---|---|---|---|"
    assert lines[at + 7] == "| dgx4 | 10:20:05-10:21:59 | 8.0 MiB | 40.0 MiB | 1 |"
    assert lines[at + 9] == "lane: 72.0 MiB from the NAS, 120.0 MiB from peers"
    assert lines[-1] == "- host dgx4 failed in play verify, task t: m"


def test_the_terminal_table_is_followed_by_the_stage_pass_block():
    from rich.console import Console
    rows = table.table_rows(lane_reports())
    for width in (40, 250):
        out = io.StringIO()
        table.print_table(Console(file=out, width=width, force_terminal=False), rows, title="t")
        text = out.getvalue()
        assert "\n".join(table.stage_lines(rows)) in text, width


def test_the_plain_table_folds_into_bands_of_100_columns_each_led_by_the_host():
    report, other = fixture("report-stage-ok.json"), fixture("report-stage-ok.json")
    report["engine"] = {"started": True, "ready": {"state": "dead"},
                        "smoke": {"error": "connection refused by 10.0.0.1:8000 " * 3}}
    other.update(host="a-much-longer-host-name", rank=1)
    rows = table.table_rows({"localhost": report, "a-much-longer-host-name": other})
    lines = table.render_plain(rows).split("\n\nStage pass")[0].splitlines()
    bands = [band.splitlines() for band in "\n".join(lines).split("\n\n")]
    assert len(bands) >= 2 and all(len(band) == 1 + len(rows) for band in bands), lines
    assert all(band[0].startswith("HOST ") for band in bands)
    assert all(sorted(line.split()[0] for line in band[1:]) == ["a-much-longer-host-name", "localhost"]
               for band in bands)
    headers = " ".join(band[0] for band in bands)
    assert all(headers.count(title) == (len(bands) if key == "host" else 1) for key, title in table.COLUMNS)
    # Every line fits, but a cell wider than the fold (the smoke error) gets a band with the host alone.
    assert all(len(line) <= 100 for band in bands for line in band if "connection refused" not in line)
    [wide] = [band for band in bands if "connection refused" in "".join(band)]
    assert wide[0].split() == ["HOST", "SMOKE"], wide
