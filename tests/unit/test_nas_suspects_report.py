"""engine_manifest's refusal from the host report on the controller: a roll-back onto a wiped or swapped local hub
(the node's own record of the NAS blobs found corrupt gone with it) still refuses what the host's last real stage
and verify passes found corrupt (the latest view's nas_suspects, and its rows), until the NAS file proves its
name."""
import json
import os
import shutil

import pytest

from nashub import build_nas
from ansible.module_utils.dgx_nas_suspects import suspect_text
from ansible.module_utils.dgx_report import latest_view
from modrun import run_main
from test_mirror import (MAIN, PAGE15, corrupt_nas_blob, expect_failure, fresh_nas, local,  # noqa: F401
                         nas_blob_real, selected, stage)
from test_module_docs import check_result
from test_nas_suspects import manifest_args, restore_nas_blob

REPORT = "/ctl/reports/dgx1.json"


def found_corrupt(nas, local, shard=None):
    """Staged and proven, one NAS blob rots, a sample verify finds it: (shard, etag, the verify's report row)."""
    shard = shard or nas.repo()["shards"][0]
    etag = selected(nas)[shard]["etag"]
    stage(nas, local, ignore_patterns=PAGE15, verify="full")
    corrupt_nas_blob(nas, etag)
    row = expect_failure(nas, local, ignore_patterns=PAGE15, verify="sample", phase="verify").result["report"]
    assert row["nas_corrupt_blobs"][0]["blob"] == etag
    return shard, etag, row


def wipe(local):
    """`mv hub hub.saved; mkdir hub`: the node's record of the suspects goes with the local hub."""
    shutil.rmtree(str(local))
    local.mkdir()


def report_text(**passes):
    """The host's latest view as host_report writes it: the last real rows of each pass, and its plays."""
    return json.dumps({"host": "dgx1", "passes": passes,
                       "plays": dict((name, {"run_id": "20261201T101737Z-556f", "started": "2026-12-01T10:17:40Z",
                                             "finished": "2026-12-01T10:18:45Z", "status": "failed"})
                                     for name in passes)})


def clean(row):
    return dict(row, nas_corrupt=[], nas_corrupt_blobs=[], status="ok")


def run(args, check_mode=False, expect_failure=False):
    return check_result("engine_manifest", args, run_main("engine_manifest", args, check_mode=check_mode),
                        expect_failure=expect_failure)


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_roll_back_onto_a_wiped_local_hub_refuses_what_the_host_report_found_corrupt(fresh_nas, local, check_mode):
    nas = fresh_nas
    shard, etag, row = found_corrupt(nas, local)
    wipe(local)
    assert run(manifest_args(nas, local), check_mode)["nas_corrupt"] == []       # the node forgot it
    args = manifest_args(nas, local, host_report=report_text(verify=[row]), host_report_path=REPORT)
    result = run(args, check_mode, expect_failure=True)
    [found] = result["nas_corrupt"]
    assert (found["path"], found["blob"]) == (shard, etag)
    for words in (shard, etag, "the host report on the controller (%s)" % REPORT, "by the verify pass",
                  "Nothing was written or stopped", "Re-download them on the NAS",
                  "`dgx-stage serve -e engine_bind_from=nas -e engine_allow_corrupt_nas=true`"):
        assert words in result["msg"], words
    # A row written before rows named blobs gives the paths at its commit.
    old = dict(row)
    del old["nas_corrupt_blobs"]
    args["host_report"] = report_text(verify=[old])
    assert [f["blob"] for f in run(args, check_mode, expect_failure=True)["nas_corrupt"]] == [etag]
    # Another hub_local_root, empty: the same.
    args = dict(args, hub_local_root=str(local.parent / "empty"))
    assert [f["blob"] for f in run(args, check_mode, expect_failure=True)["nas_corrupt"]] == [etag]


def test_the_suspect_goes_when_its_pass_ran_again_without_it_or_the_nas_file_proves_its_name(fresh_nas, local):
    nas = fresh_nas
    _shard, etag, row = found_corrupt(nas, local)
    wipe(local)
    # The verify pass ran again and no longer lists it: the report's latest view holds that row only.
    args = manifest_args(nas, local, host_report=report_text(stage=[clean(dict(row, phase="stage"))],
                                                             verify=[clean(row)]))
    assert run(args)["nas_corrupt"] == []
    # A check-mode row is a plan, never a finding.
    args["host_report"] = report_text(verify=[dict(row, check_mode=True)])
    assert run(args)["nas_corrupt"] == []
    # Still listed, but re-downloaded on the NAS since: hashed now, and bound.
    args["host_report"] = report_text(verify=[row])
    assert [f["blob"] for f in run(args, expect_failure=True)["nas_corrupt"]] == [etag]
    restore_nas_blob(nas, etag)
    assert run(args)["nas_corrupt"] == []


def test_told_to_it_binds_what_the_host_report_found_corrupt_with_a_warning(fresh_nas, local):
    nas = fresh_nas
    shard, etag, row = found_corrupt(nas, local)
    wipe(local)
    args = manifest_args(nas, local, host_report=report_text(verify=[row]), host_report_path=REPORT,
                         allow_corrupt_nas=True)
    result = run(args)
    assert [(f["path"], f["blob"]) for f in result["nas_corrupt"]] == [(shard, etag)]
    # The warning is suspect_text's (module warnings are process-global, so it is rebuilt here).
    warning = suspect_text(result["nas_corrupt"], True, "nas")
    assert warning.startswith("engine_allow_corrupt_nas is set: binding from the NAS 1 file(s)")
    assert etag in warning and "the host report on the controller (%s)" % REPORT in warning


def test_a_blob_the_node_still_records_is_named_once(fresh_nas, local):
    nas = fresh_nas
    _shard, etag, row = found_corrupt(nas, local)
    args = manifest_args(nas, local, host_report=report_text(stage=[dict(row, phase="stage")], verify=[row]))
    [found] = run(args, expect_failure=True)["nas_corrupt"]
    assert found["blob"] == etag and "unchanged since" in found["why"]      # the node's record, with its identity


def test_a_host_report_that_cannot_be_read_refuses_rather_than_binding_blind(fresh_nas, local):
    nas = fresh_nas
    stage(nas, local, ignore_patterns=PAGE15)
    args = manifest_args(nas, local, host_report="{", host_report_path=REPORT)
    [found] = run(args, expect_failure=True)["nas_corrupt"]
    assert found["path"] is None and "the host report on the controller (%s)" % REPORT in found["why"]


def test_a_blob_in_a_store_named_by_another_hash_is_refused_from_the_host_report(tmp_path, local):
    # The newer hub store names its files by another hash: the snapshot link's first hop names the blob.
    nas = build_nas(tmp_path / "nas", hf_native=True)
    shard = next(p for p, f in selected(nas).items() if f.get("store_path") and f["kind"] == "link")
    _shard, etag, row = found_corrupt(nas, local, shard)
    assert os.path.basename(nas_blob_real(nas, etag)) != etag
    wipe(local)
    args = manifest_args(nas, local, host_report=report_text(verify=[row]))
    [found] = run(args, expect_failure=True)["nas_corrupt"]
    assert (found["path"], found["blob"]) == (shard, etag)
    old = dict(row)                              # a row written before rows named blobs: the same
    del old["nas_corrupt_blobs"]
    args["host_report"] = report_text(verify=[old])
    assert [f["blob"] for f in run(args, expect_failure=True)["nas_corrupt"]] == [etag]
    nas.thaw()


def view(run_id, passes, check_mode=False):
    """One run's view of the host as host_report makes it, with these pass rows."""
    return {"host": "dgx1", "run_id": run_id, "started": "2026-12-01T10:00:00Z", "finished": "2026-12-01T10:01:00Z",
            "status": "check" if check_mode else "ok", "check_mode": check_mode, "tags": ["verify"],
            "skip_tags": [], "lane": None, "rank": None, "world_size": None, "hub_nas_root": None,
            "hub_local_root": None, "passes": passes, "weights": [], "engine": {},
            "plays": dict((name, {"run_id": run_id, "started": "2026-12-01T10:00:00Z",
                                  "finished": "2026-12-01T10:01:00Z", "status": "ok"}) for name in passes)}


def test_a_pass_that_reads_no_nas_byte_never_erases_the_host_reports_finding(fresh_nas, local):
    nas = fresh_nas
    shard, etag, row = found_corrupt(nas, local)
    found = latest_view(None, view("r1", {"verify": [row]}))
    assert found["nas_suspects"][etag]["paths"] == [shard] and found["nas_suspects"][etag]["run_id"] == "r1"
    # A green full verify hashes the local copies only; a pass with no row (its lock held) or limited to another
    # repo, and a --check run, prove nothing about the NAS either.
    full = stage(nas, local, ignore_patterns=PAGE15, verify="full", phase="verify")["report"]
    assert full["nas_corrupt_blobs"] == []
    for later in (view("r2", {"verify": [full]}), view("r3", {"verify": []}),
                  view("r4", {"stage": [dict(clean(row), repo_id="other/repo")]}),
                  view("r5", {"verify": [clean(row)]}, check_mode=True)):
        latest = latest_view(found, later)
        assert latest["nas_suspects"] == found["nas_suspects"]
        wipe(local)
        args = manifest_args(nas, local, host_report=json.dumps(latest), host_report_path=REPORT)
        [suspect] = run(args, expect_failure=True)["nas_corrupt"]
        assert (suspect["path"], suspect["blob"]) == (shard, etag) and "(run r1, " in suspect["why"]
    # Its way out: the NAS file re-downloaded holds its name's bytes, and is bound.
    restore_nas_blob(nas, etag)
    assert run(args)["nas_corrupt"] == []


@pytest.mark.parametrize("shape", ["plays string", "NUL in a path", "paths a string", "why an object", "path a number",
                                   "commit a list", "path leaves the snapshot", "suspects a list", "suspect blob",
                                   "suspect paths", "rows an object"])
def test_a_host_report_of_the_wrong_shape_is_unreadable(fresh_nas, local, shape):
    nas = fresh_nas
    shard, etag, row = found_corrupt(nas, local)
    wipe(local)
    blobs = row["nas_corrupt_blobs"]
    rows = {"plays string": [row], "NUL in a path": [dict(row, nas_corrupt_blobs=[dict(blobs[0], paths=["a\0b"])])],
            "paths a string": [dict(row, nas_corrupt_blobs=[dict(blobs[0], paths=shard)])],
            "why an object": [dict(row, nas_corrupt_blobs=[dict(blobs[0], why={"x": 1})])],
            "path a number": [dict(row, nas_corrupt_blobs=[dict(blobs[0], paths=[5])])],
            "commit a list": [dict(row, nas_corrupt_blobs=None, nas_corrupt=[shard], commit=[1])],
            "path leaves the snapshot": [dict(row, nas_corrupt_blobs=[dict(blobs[0], paths=["../x/" + shard])])],
            "rows an object": {"0": row}}.get(shape, [])
    report = {"passes": {"verify": rows}, "plays": {"verify": "x" if shape == "plays string" else {}}}
    report["nas_suspects"] = {"suspects a list": [etag], "suspect blob": {"x": {"repo_id": MAIN, "paths": [shard]}},
                              "suspect paths": {etag: {"repo_id": MAIN, "paths": None}}}.get(shape, {})
    args = manifest_args(nas, local, host_report=json.dumps(report), host_report_path=REPORT)
    [found] = run(args, expect_failure=True)["nas_corrupt"]
    assert found["path"] is None and "the host report on the controller (%s)" % REPORT in found["why"] \
        and "cannot be read" in found["why"]
