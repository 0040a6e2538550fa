"""The lane summary's data shaping (callback_plugins/dgx_summary.py): plain rows in, lines out."""
import importlib.util
import os
import re

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("dgx_summary",
                                               os.path.join(REPO_ROOT, "callback_plugins", "dgx_summary.py"))
summary = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(summary)

MIB = 1024 * 1024
GIB = 1024 * MIB


def row(repo="org/model", copied=0, reused=0, repaired=0, nbytes=0, duration=0.0, verify="none", status="ok",
        check=False):
    return {"repo_id": repo, "revision": "main", "commit": "b7a6f9ba26b1707994fd55fc4fd1d165b3963805",
            "blobs": {"copied": copied, "reused": reused, "repaired": repaired}, "bytes_copied": nbytes,
            "duration_s": duration, "verify": verify, "status": status, "check_mode": check}


def table(lines):
    """{(host, repo): {column: cell}} of a summary's table (cells are split on two or more spaces)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("HOST "))
    header = re.split(r"\s{2,}", lines[start])
    cells = {}
    for line in lines[start + 1:]:
        if line.startswith("wall time"):
            break
        parts = dict(zip(header, re.split(r"\s{2,}", line, maxsplit=len(header) - 1)))
        cells[(parts["HOST"], parts["REPO"])] = parts
    return cells


@pytest.mark.parametrize("size,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (48 * MIB, "48.0 MiB"),
                                       (int(2.5 * GIB), "2.50 GiB"), (3 * 1024 * GIB, "3.00 TiB")])
def test_sizes_are_binary_units(size, text):
    assert summary.human_bytes(size) == text


@pytest.mark.parametrize("seconds,text", [(8.44, "8.4 s"), (185, "3 min 05 s"), (3725, "1 h 02 min")])
def test_wall_time_reads_at_a_glance(seconds, text):
    assert summary.human_seconds(seconds) == text


def test_pass_is_the_plays_tag_then_the_modules_phase():
    assert summary.pass_of(("preflight",), "stage") == "preflight"
    assert summary.pass_of(("always", "verify"), "stage") == "verify"
    assert summary.pass_of((), "verify") == "verify"
    assert summary.pass_of(None, None) == "stage"


def test_a_real_run_adds_stage_and_verify_and_the_plan_does_not_count():
    merged = summary.merge_repo({
        "preflight": row(copied=13, nbytes=48 * MIB, duration=0.01, status="check", check=True),
        "stage": row(copied=13, reused=4, nbytes=48 * MIB, duration=1.5),
        "verify": row(reused=17, repaired=1, nbytes=8 * MIB, duration=0.5, verify="full"),
    })
    assert (merged["copied"], merged["reused"], merged["repaired"]) == (13, 4, 1)
    assert merged["bytes"] == 56 * MIB and merged["duration_s"] == pytest.approx(2.0)
    assert merged["mib_per_s"] == pytest.approx(28.0)
    assert (merged["verify"], merged["status"]) == ("full", "ok")


def test_a_no_op_run_has_no_rate():
    merged = summary.merge_repo({"stage": row(reused=17, duration=0.01), "verify": row(reused=17, verify="sample")})
    assert merged["bytes"] == 0 and merged["mib_per_s"] is None and merged["verify"] == "sample"


def test_check_mode_is_the_plan_of_one_pass_with_no_rate():
    plan = row(copied=13, nbytes=48 * MIB, duration=0.002, status="check", check=True)
    merged = summary.merge_repo({"preflight": plan, "stage": plan, "verify": dict(plan, verify="sample")})
    assert (merged["copied"], merged["bytes"], merged["status"]) == (13, 48 * MIB, "check")
    assert merged["mib_per_s"] is None


def test_a_failed_row_fails_the_repo_and_verify_alone_stands_for_itself():
    merged = summary.merge_repo({"stage": row(copied=3, status="failed")})
    assert merged["status"] == "failed" and merged["verify"] == "-"
    merged = summary.merge_repo({"verify": row(reused=17, repaired=2, verify="full")})
    assert (merged["reused"], merged["repaired"], merged["verify"]) == (17, 2, "full")


def test_real_files_count_as_copied_files():
    assert summary.files_copied(dict(row(copied=2), real_files={"copied": 3})) == 5


def test_host_rows_put_the_failed_task_on_the_failed_repo_or_a_row_of_its_own():
    failure = {"play": "stage", "task": "stage : Mirror | Each repo", "msg": "bad blob"}
    repos = {"a@main": {"stage": row(repo="a", status="failed")}, "b@main": {"stage": row(repo="b")}}
    rows = summary.host_rows("n1", 1, repos, "failed", failure)
    assert [r["status"] for r in rows] == ["failed: stage: stage : Mirror | Each repo", "ok"]
    later = summary.host_rows("n1", 1, {"b@main": {"stage": row(repo="b")}}, "failed",
                              {"play": "manifest", "task": "engine : Manifest | Write"})
    assert [(r["repo_id"], r["status"]) for r in later] == [("b", "ok"),
                                                           ("-", "failed: manifest: engine : Manifest | Write")]
    bare = summary.host_rows("n2", 0, {}, "unreachable", {"play": "preflight", "task": "Gathering Facts"})
    assert bare == [{"host": "n2", "rank": 0, "repo_id": "-", "status": "unreachable: preflight: Gathering Facts"}]
    went_on = summary.host_rows("n3", 2, {"a@main": {"stage": row(repo="a", status="failed")}}, "ok")
    assert went_on[0]["status"] == "failed (host went on)"


def test_next_step_names_the_host_task_report_and_command():
    lines = summary.next_step_lines("dgx2", "failed", {"play": "stage", "tag": "stage", "task": "stage : Mirror | x",
                                                       "msg": "1 NAS blob(s)\n do not hold"},
                                    "reports/dgx2.json", "inventory/dgx", "stage-deepseek.yml")
    assert lines[0] == "dgx2 failed in play stage, task 'stage : Mirror | x': 1 NAS blob(s) do not hold"
    assert lines[1].startswith("next step: read the error above and the host report reports/dgx2.json")
    assert "ansible-playbook -i inventory/dgx stage-deepseek.yml --limit dgx2" in lines[1]
    assert "--tags stage" in lines[1]
    gone = summary.next_step_lines("dgx3", "unreachable", {"play": "Lane facts", "task": "Gathering Facts"}, None,
                                   None, None)
    assert gone[0] == "dgx3 unreachable in play Lane facts, task 'Gathering Facts'"
    assert "check that dgx3 answers" in gone[1] and "--tags" not in gone[1]
    untagged = summary.next_step_lines("dgx4", "failed", {"play": "Lane facts", "tag": None, "task": "t"}, None,
                                       None, None)
    assert "--tags" not in untagged[1] and "reports/dgx4.json" in untagged[1]


def _state(**hosts):
    return {"hosts": hosts, "check_mode": False, "inventory": "inventory/demo", "playbook": "stage-deepseek.yml",
            "wall_s": 8.44, "run_id": "20261130T204512Z-3fa2"}


def test_summary_is_one_table_ordered_by_rank_with_totals():
    repos = {"a@main": {"stage": row(repo="a", copied=2, nbytes=GIB, duration=2.0),
                        "verify": row(repo="a", reused=2, verify="sample")}}
    lines = summary.summary_lines(_state(
        n2={"rank": 1, "lane": "exl3_2x", "repos": repos},
        n1={"rank": 0, "lane": "exl3_2x", "repos": repos},
        bystander={"lane": "exl3_2x", "repos": {}},     # in the inventory, not in the lane
    ))
    assert lines[0] == "DGX-STAGE LANE SUMMARY: lane exl3_2x, 2 hosts, run 20261130T204512Z-3fa2"
    cells = table(lines)
    assert list(cells) == [("n1", "a"), ("n2", "a")]
    first = cells[("n1", "a")]
    assert (first["RANK"], first["COPIED"], first["GiB"], first["MiB/s"], first["STATUS"]) == ("0", "2", "1.00",
                                                                                              "512", "ok")
    assert lines[-1] == "wall time 8.4 s; 2/2 hosts ok; copied 4 files, 2.00 GiB; repaired 0"


def test_summary_of_a_failed_host_ends_with_its_next_step():
    lines = summary.summary_lines(_state(
        n1={"rank": 0, "lane": "l", "repos": {"a@main": {"stage": row(repo="a", status="failed")}}, "failed": True,
            "failure": {"play": "stage", "task": "stage : Mirror | x", "msg": "corrupt"},
            "report_path": "reports/n1.json"},
        n2={"rank": 1, "lane": "l", "repos": {"a@main": {"stage": row(repo="a")}}},
    ))
    assert table(lines)[("n1", "a")]["STATUS"] == "failed: stage: stage : Mirror | x"
    assert table(lines)[("n2", "a")]["STATUS"] == "ok"
    assert "1/2 hosts ok" in lines[-3] and lines[-3].endswith("FAILED: n1")
    assert lines[-2] == "n1 failed in play stage, task 'stage : Mirror | x': corrupt"
    assert lines[-1].startswith("next step: ") and "reports/n1.json" in lines[-1] and "--limit n1" in lines[-1]


def test_check_mode_says_what_would_be_copied():
    plan = row(repo="a", copied=13, nbytes=48 * MIB, status="check", check=True)
    state = dict(_state(n1={"rank": 0, "lane": "l", "repos": {"a@main": {"preflight": plan, "stage": plan}}}),
                 check_mode=True)
    lines = summary.summary_lines(state)
    assert lines[0].endswith("CHECK MODE (nothing was written)")
    assert "TO COPY" in lines[1] and table(lines)[("n1", "a")]["STATUS"] == "check"
    assert lines[-1] == "wall time 8.4 s; 1/1 hosts checked; would copy 13 files, 0.05 GiB (48.0 MiB)"


def test_an_engine_left_off_is_said_once():
    repos = {"a@main": {"stage": row(repo="a")}}
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": repos, "engine_runs": False}))
    assert lines[-1].endswith("; engine not started (engine_enabled is false)")
    lines = summary.summary_lines(_state(n1={"rank": 0, "lane": "l", "repos": repos, "engine_runs": True}))
    assert "engine" not in lines[-1]


def test_nothing_to_say_without_a_lane():
    assert summary.summary_lines(_state(other={"repos": {}})) == []
