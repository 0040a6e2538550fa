"""engine_manifest's refusal from the host report on the controller: a roll-back onto a wiped or swapped local hub
(the node's own record of the NAS blobs found corrupt gone with it) still refuses what the host's last real stage
and verify passes found corrupt, until that pass runs again without it or the NAS file proves its name."""
import json
import shutil

import pytest

from ansible.module_utils.dgx_nas_suspects import suspect_text
from modrun import run_main
from test_mirror import MAIN, PAGE15, corrupt_nas_blob, expect_failure, fresh_nas, local, selected, stage  # noqa: F401
from test_module_docs import check_result
from test_nas_suspects import manifest_args, restore_nas_blob

REPORT = "/ctl/reports/dgx1.json"


def found_corrupt(nas, local):
    """Staged and proven, one NAS blob rots, a sample verify finds it: (shard, etag, the verify's report row)."""
    shard = nas.repo()["shards"][0]
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
