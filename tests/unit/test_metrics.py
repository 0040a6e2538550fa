"""dgx_metrics and stage_metrics: the node_exporter textfile rendered from a host's latest report view, read
back with prometheus_client's own parser (names, labels, values, escaping); the previous file's last success
kept on failure; written atomically, 0644, not rewritten when unchanged, changed=false when only the run's
timestamps moved."""
import os
import stat

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_metrics import (content_change, escape_label, previous_state, render, samples_of,
                                              write_metrics)
from ansible.module_utils.dgx_units import utc_epoch
from test_module_docs import check_result, run_main

COMMIT = "c" * 40
MAIN, DRAFTER = "org/main", "org/drafter"
NO_PREVIOUS = {"last_success": None, "last_verify": {}}


def row(repo, status="ok", staged=100, repaired=0, corrupt=(), verify="none", commit=COMMIT):
    return {"repo_id": repo, "repo_type": "model", "status": status, "commit": commit, "bytes_staged": staged,
            "blobs": {"copied": 0, "reused": 1, "repaired": repaired}, "nas_corrupt": list(corrupt), "verify": verify}


def view(status="ok", finished="2026-11-30T21:00:00Z", stage=None, verify=None, engine=None, check=False,
         verify_finished="2026-11-30T20:59:00Z", stage_finished="2026-11-30T20:50:00Z"):
    plays, passes = {}, {}
    if stage is not None:
        plays["stage"], passes["stage"] = {"finished": stage_finished, "status": "ok"}, stage
    if verify is not None:
        plays["verify"], passes["verify"] = {"finished": verify_finished, "status": "ok"}, verify
    return {"host": "dgx1", "run_id": "r1", "status": status, "finished": finished, "check_mode": check,
            "plays": plays, "passes": passes, "engine": engine or {}, "last_real_run": None}


def families(text):
    """{name: [(labels, value)]} as Prometheus reads the file."""
    return dict((f.name, [(s.labels, s.value) for s in f.samples]) for f in text_string_to_metric_families(text))


def types(text):
    return dict((f.name, (f.type, f.documentation)) for f in text_string_to_metric_families(text))


def test_a_good_run_renders_every_metric_prometheus_reads_back():
    report = view(stage=[row(MAIN, staged=1000), row(DRAFTER, staged=20)],
                  verify=[row(MAIN, staged=1000, repaired=2, verify="full"), row(DRAFTER, staged=20, verify="full")],
                  engine={"decode": {"decode_tok_s": 35.25}})
    text = render(samples_of(report, NO_PREVIOUS))
    got = families(text)
    assert got["dgx_stage_last_run_success"] == [({}, 1.0)]
    assert got["dgx_stage_last_success_timestamp_seconds"] == [({}, utc_epoch("2026-11-30T21:00:00Z"))]
    assert utc_epoch("2026-11-30T21:00:00Z") == 1796072400.0
    assert got["dgx_stage_repo_staged_bytes"] == [
        ({"repo": DRAFTER, "repo_type": "model", "commit": COMMIT}, 20.0),
        ({"repo": MAIN, "repo_type": "model", "commit": COMMIT}, 1000.0)]
    verified = utc_epoch("2026-11-30T20:59:00Z")
    assert got["dgx_stage_last_verify_timestamp_seconds"] == [({"repo": DRAFTER, "mode": "full"}, verified),
                                                              ({"repo": MAIN, "mode": "full"}, verified)]
    assert got["dgx_stage_blobs_repaired"] == [({}, 2.0)] and got["dgx_stage_nas_corrupt_blobs"] == [({}, 0.0)]
    assert got["dgx_stage_decode_tokens_per_second"] == [({}, 35.25)]
    # Every metric a gauge with its help; snake_case, base units.
    for name, (kind, documentation) in types(text).items():
        assert kind == "gauge" and documentation and name.startswith("dgx_stage_") and name == name.lower()
    assert text.endswith("\n") and "# TYPE dgx_stage_repo_staged_bytes gauge" in text


def test_label_values_are_escaped_and_read_back_exactly():
    nasty = 'org/we"ird\\name\nx'
    text = render(samples_of(view(stage=[row(nasty)]), NO_PREVIOUS))
    assert 'repo="org/we\\"ird\\\\name\\nx"' in text
    assert families(text)["dgx_stage_repo_staged_bytes"][0][0]["repo"] == nasty
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    # ... and the previous-file reader unescapes them the same way.
    assert previous_state(render(samples_of(view(verify=[row(nasty, verify="sample")]), NO_PREVIOUS)))[
        "last_verify"] == {nasty: ("sample", utc_epoch("2026-11-30T20:59:00Z"))}


def test_a_failed_run_says_0_and_keeps_the_last_success_of_the_previous_file():
    good = render(samples_of(view(stage=[row(MAIN)]), NO_PREVIOUS))
    failed = view(status="failed", finished="2026-12-01T08:00:00Z",
                  stage=[row(MAIN, status="failed", corrupt=["w/a.safetensors", "w/a.safetensors", "w/b"])])
    text = render(samples_of(failed, previous_state(good)))
    got = families(text)
    assert got["dgx_stage_last_run_success"] == [({}, 0.0)]
    assert got["dgx_stage_last_success_timestamp_seconds"] == [({}, utc_epoch("2026-11-30T21:00:00Z"))]
    assert got["dgx_stage_nas_corrupt_blobs"] == [({}, 2.0)]
    assert "dgx_stage_repo_staged_bytes" not in got           # a failed pass proves no staged bytes
    # Without a previous file a failed host has no last success at all (never a made-up one).
    assert "dgx_stage_last_success_timestamp_seconds" not in families(render(samples_of(failed, NO_PREVIOUS)))


def test_a_repo_whose_verify_failed_keeps_its_previous_verify_sample():
    first = render(samples_of(view(verify=[row(MAIN, verify="full"), row(DRAFTER, verify="full")]), NO_PREVIOUS))
    second = view(status="failed", verify=[row(MAIN, status="failed", verify="sample"), row(DRAFTER, verify="sample")],
                  verify_finished="2026-12-01T09:00:00Z")
    got = families(render(samples_of(second, previous_state(first))))["dgx_stage_last_verify_timestamp_seconds"]
    assert got == [({"repo": DRAFTER, "mode": "sample"}, utc_epoch("2026-12-01T09:00:00Z")),
                   ({"repo": MAIN, "mode": "full"}, utc_epoch("2026-11-30T20:59:00Z"))]


def test_a_repo_no_longer_staged_loses_its_verify_sample_a_view_without_passes_keeps_them():
    first = render(samples_of(view(verify=[row(MAIN, verify="full"), row(DRAFTER, verify="full")]), NO_PREVIOUS))
    # DRAFTER left stage_repos: the next verify pass has no row for it (the report's passes are per run).
    second = view(verify=[row(MAIN, verify="sample")], verify_finished="2026-12-01T09:00:00Z")
    got = families(render(samples_of(second, previous_state(first))))["dgx_stage_last_verify_timestamp_seconds"]
    assert got == [({"repo": MAIN, "mode": "sample"}, utc_epoch("2026-12-01T09:00:00Z"))]
    # A repo only the stage pass has rows for this time still keeps its previous verify sample.
    third = view(stage=[row(DRAFTER)], verify=[row(MAIN, verify="sample")], verify_finished="2026-12-01T09:00:00Z")
    got = families(render(samples_of(third, previous_state(first))))["dgx_stage_last_verify_timestamp_seconds"]
    assert [labels["repo"] for labels, _v in got] == [DRAFTER, MAIN]
    got = families(render(samples_of(view(status="failed"), previous_state(first))))
    assert len(got["dgx_stage_last_verify_timestamp_seconds"]) == 2


def test_the_later_pass_gives_the_staged_commit():
    report = view(stage=[row(MAIN, commit="1" * 40, staged=5)], verify=[row(MAIN, commit="2" * 40, staged=6)],
                  stage_finished="2026-11-30T22:00:00Z", verify_finished="2026-11-30T20:00:00Z")
    got = families(render(samples_of(report, NO_PREVIOUS)))["dgx_stage_repo_staged_bytes"]
    assert got == [({"repo": MAIN, "repo_type": "model", "commit": "1" * 40}, 5.0)]


def test_a_check_runs_view_speaks_for_the_last_real_run():
    report = view(status="check", check=True, stage=[row(MAIN)])
    report["last_real_run"] = {"status": "ok", "finished": "2026-11-29T10:00:00Z"}
    got = families(render(samples_of(report, NO_PREVIOUS)))
    assert got["dgx_stage_last_run_success"] == [({}, 1.0)]
    assert got["dgx_stage_last_success_timestamp_seconds"] == [({}, utc_epoch("2026-11-29T10:00:00Z"))]


def test_garbage_in_the_view_and_the_previous_file_is_tolerated():
    report = {"status": "ok", "finished": "garbage", "passes": {"stage": ["x", {"repo_id": MAIN, "status": "ok",
                                                                                 "commit": COMMIT, "blobs": "y"}]},
              "plays": "z", "engine": {"decode": {"decode_tok_s": None}}}
    text = render(samples_of(report, previous_state("garbage\n{{{\ndgx_stage_last_success_timestamp_seconds x\n")))
    got = families(text)
    assert got["dgx_stage_last_run_success"] == [({}, 1.0)] and "dgx_stage_decode_tokens_per_second" not in got
    assert got["dgx_stage_repo_staged_bytes"][0][1] == 0.0


@pytest.mark.parametrize("garbage", ["NaN", "+Inf", "-Inf", "-5", "0", "1e300"])
def test_a_garbage_last_success_in_the_previous_file_is_not_kept(garbage):
    previous = ("dgx_stage_last_success_timestamp_seconds %s\n"
                'dgx_stage_last_verify_timestamp_seconds{repo="%s",mode="full"} %s\n' % (garbage, MAIN, garbage))
    failed = view(status="failed", finished="2026-12-01T08:00:00Z")
    got = families(render(samples_of(failed, previous_state(previous))))
    assert got["dgx_stage_last_run_success"] == [({}, 0.0)]
    assert "dgx_stage_last_success_timestamp_seconds" not in got
    assert "dgx_stage_last_verify_timestamp_seconds" not in got


def test_only_the_samples_this_module_writes_are_kept_from_the_previous_file():
    previous = ('dgx_stage_last_success_timestamp_seconds{host="other"} 1700000000\n'
                'dgx_stage_last_verify_timestamp_seconds{repo="%s",mode="full",host="other"} 1700000000\n'
                'dgx_stage_last_verify_timestamp_seconds{repo="%s",mode="sample"} 1700000001\n' % (MAIN, DRAFTER))
    state = previous_state(previous)
    assert state == {"last_success": None, "last_verify": {DRAFTER: ("sample", 1700000001.0)}}


def test_only_moved_timestamps_are_not_a_content_change():
    first = render(samples_of(view(verify=[row(MAIN, verify="full")]), NO_PREVIOUS))
    later = render(samples_of(view(verify=[row(MAIN, verify="full")], finished="2026-12-01T00:00:00Z",
                                   verify_finished="2026-12-01T00:00:00Z"), NO_PREVIOUS))
    assert content_change(first, first) == "none"
    assert content_change(first, later) == "timestamps"
    assert content_change(None, first) == "content"
    other_mode = render(samples_of(view(verify=[row(MAIN, verify="sample")]), NO_PREVIOUS))
    assert content_change(first, other_mode) == "content"
    failed = render(samples_of(view(status="failed", verify=[row(MAIN, verify="full")]), previous_state(first)))
    assert content_change(first, failed) == "content"


# --- the file ------------------------------------------------------------------------------------------

def test_written_atomically_0644_and_not_rewritten_when_unchanged(tmp_path):
    report = view(stage=[row(MAIN)])
    result = write_metrics(str(tmp_path), report)
    path = tmp_path / "dgx_stage.prom"
    assert result["written"] and result["change"] == "content" and path.read_text() == result["content"]
    assert stat.S_IMODE(os.stat(str(path)).st_mode) == 0o644 and os.listdir(str(tmp_path)) == ["dgx_stage.prom"]
    inode = os.stat(str(path)).st_ino
    again = write_metrics(str(tmp_path), report)
    assert (again["written"], again["change"]) == (False, "none") and os.stat(str(path)).st_ino == inode
    later = write_metrics(str(tmp_path), dict(report, finished="2026-12-02T00:00:00Z"))
    assert (later["written"], later["change"]) == (True, "timestamps") and os.stat(str(path)).st_ino != inode


def test_check_mode_writes_nothing(tmp_path):
    result = write_metrics(str(tmp_path), view(stage=[row(MAIN)]), write=False)
    assert not result["written"] and "dgx_stage_repo_staged_bytes" in result["content"] and os.listdir(str(tmp_path)) == []


def test_a_symlinked_directory_is_followed_a_symlinked_file_is_replaced_not_written_through(tmp_path):
    real = tmp_path / "textfile"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (real / "dgx_stage.prom").symlink_to(victim)
    write_metrics(str(tmp_path / "link"), view(stage=[row(MAIN)]))
    assert victim.read_text() == "keep" and not os.path.islink(str(real / "dgx_stage.prom"))
    assert "dgx_stage_repo_staged_bytes" in (real / "dgx_stage.prom").read_text()


@pytest.mark.parametrize("make, words", [
    (lambda p: str(p / "missing"), "is not an existing directory"),
    (lambda p: str(p / "file") if (p / "file").write_text("x") else None, "is not an existing directory"),
    (lambda p: "relative/dir", "not an absolute path"),
])
def test_a_bad_directory_is_refused_naming_it_and_the_fix(tmp_path, make, words):
    directory = make(tmp_path)
    with pytest.raises(StageError) as err:
        write_metrics(directory, view())
    assert words in str(err.value) and directory in str(err.value) and "stage_metrics_dir" in str(err.value)


def test_stage_metrics_module_returns_what_it_documents(tmp_path):
    args = {"dir": str(tmp_path), "report": view(stage=[row(MAIN)])}
    result = check_result("stage_metrics", args, run_main("stage_metrics", args))
    assert result["changed"] is True and result["change"] == "content" and result["written"] is True
    result = check_result("stage_metrics", args, run_main("stage_metrics", args))
    assert result["changed"] is False and result["change"] == "none"
    later = dict(args, report=view(stage=[row(MAIN)], finished="2026-12-02T00:00:00Z"))
    result = check_result("stage_metrics", later, run_main("stage_metrics", later))
    assert result["changed"] is False and result["change"] == "timestamps" and result["written"] is True
    # --check --diff: the old and the new file, nothing written.
    diff = dict(args, report=view(stage=[row(MAIN, staged=7)]), _ansible_check_mode=True, _ansible_diff=True)
    result = check_result("stage_metrics", diff, run_main("stage_metrics", diff))
    assert result["changed"] is True and result["written"] is False and result["diff"]["after"] == result["content"]
    assert result["diff"]["before"] == (tmp_path / "dgx_stage.prom").read_text() != result["content"]
    bad = dict(args, dir=str(tmp_path / "nope"))
    result = check_result("stage_metrics", bad, run_main("stage_metrics", bad), expect_failure=True)
    assert str(tmp_path / "nope") in result["msg"]


def test_the_file_names_its_host_and_a_directory_shared_with_another_host_is_refused(tmp_path):
    """Two hosts writing one shared directory (one NFS dir for the lane): the second would overwrite the first's
    file and keep its last success as its own; it is refused, naming both hosts and the fix."""
    first = write_metrics(str(tmp_path), view(stage=[row(MAIN)]))
    assert first["content"].splitlines()[0] == "# dgx-stage textfile of host dgx1"
    assert families(first["content"])["dgx_stage_last_run_success"] == [({}, 1.0)]    # a comment Prometheus skips
    before = (tmp_path / "dgx_stage.prom").read_text()
    with pytest.raises(StageError) as err:
        write_metrics(str(tmp_path), dict(view(status="failed"), host="dgx2"))
    assert "host dgx1, not dgx2" in str(err.value) and str(tmp_path) in str(err.value)
    assert "not one shared between hosts" in str(err.value)
    assert (tmp_path / "dgx_stage.prom").read_text() == before and os.listdir(str(tmp_path)) == ["dgx_stage.prom"]
    # The same host again, and a file written before files named their host, are written as before.
    assert write_metrics(str(tmp_path), view(status="failed"))["written"]
    (tmp_path / "dgx_stage.prom").write_text("dgx_stage_last_run_success 1\n")
    assert write_metrics(str(tmp_path), dict(view(), host="dgx2"))["written"]


@pytest.mark.parametrize("write", [True, False])
def test_a_directory_named_like_the_textfile_is_refused_with_the_fix_and_nothing_is_left(tmp_path, write):
    (tmp_path / "dgx_stage.prom").mkdir()
    with pytest.raises(StageError) as err:
        write_metrics(str(tmp_path), view(stage=[row(MAIN)]), write=write)
    assert "is a directory" in str(err.value) and "remove it" in str(err.value)
    assert str(tmp_path) in str(err.value) and os.listdir(str(tmp_path)) == ["dgx_stage.prom"]


def test_the_temp_file_of_a_killed_write_is_removed_by_the_next_one_others_are_left(tmp_path):
    import subprocess
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = ".dgx-stage-tmp.dgx_stage.prom.%d.0123abcd" % dead.pid
    running = ".dgx-stage-tmp.dgx_stage.prom.%d.89abcdef" % os.getpid()      # a write in flight: kept
    others = [killed.replace("dgx_stage.prom", "other.prom"), "node.prom"]
    for name in [killed, running] + others:
        (tmp_path / name).write_text("x")
    planned = write_metrics(str(tmp_path), view(stage=[row(MAIN)]), write=False)
    assert planned["debris"] == [killed] and (tmp_path / killed).exists()      # check mode removes nothing
    result = write_metrics(str(tmp_path), view(stage=[row(MAIN)]))
    assert result["debris"] == [killed]
    assert sorted(os.listdir(str(tmp_path))) == sorted([running, "dgx_stage.prom"] + others)
