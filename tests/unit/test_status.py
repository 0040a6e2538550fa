"""dgx_status and stage_status: what a node holds, read without changing anything - the staged commit and
its snapshot, files and bytes local, last stage and verify from the progress file (garbage tolerated),
receipts, and the engine's state from captured engine_probe wait results."""
import json
import os

import pytest

from ansible.module_utils.dgx_runtime import container_facts
from ansible.module_utils.dgx_progress_file import passes_of, read_document
from ansible.module_utils.dgx_status import (engine_status, host_status, manifest_lines, manifest_status,
                                             pass_summary, repo_status, status_lines)
from test_module_docs import check_result, run_main
from treestate import tree_snapshot

COMMIT = "a" * 40
OTHER = "b" * 40
REPO = {"repo_id": "org/model"}
FOLDER = "models--org--model"


def make_repo(hub, commit=COMMIT, files=None, ref="main", snapshot=True):
    """A local repo folder: refs/<ref> -> commit, blobs, a snapshot of links to them (files: {path: bytes})."""
    repo = hub / FOLDER
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    (repo / "blobs").mkdir(exist_ok=True)
    if snapshot:
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for path, data in (files or {}).items():
            blob = repo / "blobs" / ("blob-" + path.replace("/", "_"))
            blob.write_bytes(data)
            target = snap / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.path.relpath(str(blob), str(target.parent)))
    return repo


def write_progress(hub, document, folder=FOLDER):
    lock = hub / ".locks" / folder
    lock.mkdir(parents=True, exist_ok=True)
    path = lock / "dgx-stage.progress.json"
    path.write_bytes(document if isinstance(document, bytes) else json.dumps(document).encode())
    return path


def figures(phase, when, verify, status="ok", commit=COMMIT):
    return {"pass": phase, "updated_at": when, "verify": verify, "status": status, "commit": commit,
            "finished": status == "ok", "aborted": status not in ("ok", "running")}


# --- the progress file --------------------------------------------------------------------------------

def test_progress_passes_give_the_last_stage_and_verify_with_its_mode():
    raw = json.dumps(dict(figures("verify", "2026-11-30T21:00:00Z", "full"),
                          passes={"stage": figures("stage", "2026-11-30T20:00:00Z", "none"),
                                  "verify": figures("verify", "2026-11-30T21:00:00Z", "full")})).encode()
    passes, problem = passes_of(json.loads(raw))
    assert problem is None
    assert pass_summary(passes["verify"]) == {"when": "2026-11-30T21:00:00Z", "status": "ok", "verify": "full",
                                              "commit": COMMIT}
    assert pass_summary(passes["stage"])["when"] == "2026-11-30T20:00:00Z"


@pytest.mark.parametrize("raw, words", [
    (b'{"passes": {"stage": {"updated_at": "2026-11-30T2', "not JSON"),        # half-written
    (b"\xff\xfe garbage", "not JSON"),
    (b"[1, 2]", "no JSON object"),
    (json.dumps({"passes": "garbage"}).encode(), "passes is not a mapping"),
    (json.dumps({"passes": [1, 2]}).encode(), "passes is not a mapping"),
    (b" " * (4 * 1024 * 1024) + b"{}", "larger than"),
])
def test_a_garbage_progress_file_is_reported_not_raised(tmp_path, raw, words):
    (tmp_path / "progress.json").write_bytes(raw)
    document, problem = read_document(str(tmp_path / "progress.json"))
    passes, shape_problem = passes_of(document)
    assert passes == {} and words in (problem or shape_problem)


def test_a_garbage_pass_entry_is_skipped_and_named_the_others_kept():
    raw = json.dumps({"passes": {"stage": figures("stage", "2026-11-30T20:00:00Z", "none"), "verify": 7}}).encode()
    passes, problem = passes_of(json.loads(raw))
    assert list(passes) == ["stage"] and "verify" in problem


def test_pass_summary_of_garbage_figures_is_all_null():
    assert pass_summary({"updated_at": 5, "verify": ["x"]}) == {"when": None, "status": None, "verify": None,
                                                               "commit": None}
    assert pass_summary(None)["when"] is None


# --- a repo in the local hub --------------------------------------------------------------------------

def test_a_staged_repo_reports_commit_files_bytes_and_its_last_passes(tmp_path):
    make_repo(tmp_path, files={"config.json": b"{}" * 5, "w/model.safetensors": b"x" * 1000})
    write_progress(tmp_path, {"passes": {"stage": figures("stage", "2026-11-30T20:00:00Z", "none"),
                                         "verify": figures("verify", "2026-11-30T21:00:00Z", "sample")}})
    row = repo_status(str(tmp_path), REPO)
    assert (row["state"], row["commit"], row["files_local"], row["bytes_local"], row["dangling"]) == (
        "staged", COMMIT, 2, 1010, 0)
    assert (row["last_staged"], row["last_verified"], row["verify_mode"], row["last_verify_status"]) == (
        "2026-11-30T20:00:00Z", "2026-11-30T21:00:00Z", "sample", "ok")
    line = status_lines(host_status(str(tmp_path), [REPO], str(tmp_path / "cache"), [], False, "e", {}))[0]
    assert line == ("org/model@main: commit aaaaaaaaaaaa, 2 files, 1010 B local; staged 2026-11-30T20:00:00Z; "
                    "verified 2026-11-30T21:00:00Z (sample)")


def test_the_nas_blobs_the_node_holds_as_suspects_end_the_repo_line(tmp_path):
    make_repo(tmp_path, files={"w/model.safetensors": b"x" * 10})
    write_progress(tmp_path, {"passes": {"verify": figures("verify", "2026-11-30T21:00:00Z", "sample", "failed")},
                              "nas_corrupt": {"c" * 64: {"paths": ["w/model.safetensors"],
                                                         "found_at": "2026-11-30T21:00:00Z", "why": "differs"}}})
    args = {"hub_local_root": str(tmp_path), "repos": [REPO], "receipt_parent": str(tmp_path), "engine_enabled": False}
    result = check_result("stage_status", args, run_main("stage_status", args))
    assert result["status"]["repos"][0]["nas_corrupt"] == [
        {"blob": "c" * 64, "paths": ["w/model.safetensors"], "found_at": "2026-11-30T21:00:00Z"}]
    assert result["lines"][0].endswith("; NAS blobs found corrupt, not proven since (a roll-back refuses them): "
                                       "w/model.safetensors (blob cccccccccccc, found 2026-11-30T21:00:00Z)")


def test_no_local_repo_is_not_staged_and_a_ref_to_a_missing_snapshot_says_so(tmp_path):
    row = repo_status(str(tmp_path), REPO)
    assert row["state"] == "not staged" and row["commit"] is None
    make_repo(tmp_path, snapshot=False)
    row = repo_status(str(tmp_path), REPO)
    assert row["state"] == "snapshot missing" and row["commit"] == COMMIT and "snapshots/" + COMMIT in row["problem"]
    assert status_lines(host_status(str(tmp_path), [REPO], None, [], False, "e", {}))[0].startswith(
        "org/model@main: snapshot missing (refs/main points at %s" % COMMIT)


def test_another_revision_without_a_ref_is_not_staged_and_a_garbage_ref_is_named(tmp_path):
    make_repo(tmp_path, files={"a": b"1"})
    row = repo_status(str(tmp_path), dict(REPO, revision="v2"))
    assert row["state"] == "not staged" and "refs/v2" in row["problem"]
    (tmp_path / FOLDER / "refs" / "main").write_text("not a commit\n")
    row = repo_status(str(tmp_path), REPO)
    assert row["state"] == "not staged" and "not a commit hash" in row["problem"]


def test_a_commit_revision_without_a_ref_is_read_from_its_snapshot(tmp_path):
    make_repo(tmp_path, files={"a": b"12"}, ref="main")
    row = repo_status(str(tmp_path), dict(REPO, revision=COMMIT))
    assert row["state"] == "staged" and row["commit"] == COMMIT and row["bytes_local"] == 2


def test_a_symlinked_repo_folder_is_reported_and_never_read_through(tmp_path):
    outside = tmp_path / "outside"
    hub = tmp_path / "hub"
    hub.mkdir()
    make_repo(outside, files={"a": b"secret"})
    (hub / FOLDER).symlink_to(outside / FOLDER)
    row = repo_status(str(hub), REPO)
    assert row["state"] == "refused" and "symlink" in row["problem"] and str(outside / FOLDER) in row["problem"]
    assert row["commit"] is None and row["files_local"] == 0     # nothing was read through the link


def test_a_repo_folder_link_removed_while_status_reads_it_is_a_row_not_a_traceback(tmp_path, monkeypatch):
    (tmp_path / FOLDER).symlink_to(tmp_path / "elsewhere")

    def gone(path):     # the link removed between its lstat and its readlink
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "readlink", gone)
    row = repo_status(str(tmp_path), REPO)
    assert row["state"] == "refused" and "symlink" in row["problem"]


def test_a_repo_folder_that_cannot_be_looked_at_is_a_refused_row_naming_it(tmp_path, monkeypatch):
    make_repo(tmp_path, files={"a": b"1"})
    real_lstat = os.lstat

    def denied(path, *args, **kwargs):   # a folder above it not searchable by this user (EACCES)
        if str(path) == str(tmp_path / FOLDER):
            raise PermissionError(13, "Permission denied", path)
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", denied)
    row = repo_status(str(tmp_path), REPO)
    assert row["state"] == "refused" and "cannot look at %s (Permission denied)" % (tmp_path / FOLDER) in row["problem"]
    assert "become" in row["problem"], row


def test_a_snapshot_changing_while_status_reads_it_is_a_row_not_a_traceback(tmp_path, monkeypatch):
    make_repo(tmp_path, files={"a": b"1", "sub/b": b"2"})
    real_scandir = os.scandir

    def moved(path):        # a pass removing the folder between its listing and its reading
        if str(path).endswith("/sub"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", moved)
    row = repo_status(str(tmp_path), REPO)
    assert row["state"] == "error" and row["commit"] == COMMIT and "sub" in row["problem"], row
    assert "run status again" in row["problem"]


def test_a_symlinked_lock_folder_is_not_read(tmp_path):
    make_repo(tmp_path, files={"a": b"1"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "dgx-stage.progress.json").write_text(json.dumps(
        {"passes": {"verify": figures("verify", "2026-11-30T21:00:00Z", "full")}}))
    (tmp_path / ".locks").mkdir()
    (tmp_path / ".locks" / FOLDER).symlink_to(elsewhere)
    row = repo_status(str(tmp_path), REPO)
    assert row["last_verified"] is None and "symlink" in row["progress_problem"]


def _outside_repo(tmp_path):
    """A repo outside the hub whose refs, snapshot and progress would all read as staged and verified."""
    outside = tmp_path / "outside"
    make_repo(outside, files={"a": b"secret"})
    write_progress(outside, {"passes": {"verify": figures("verify", "2026-11-30T21:00:00Z", "full")}})
    hub = tmp_path / "hub"
    (hub / FOLDER).mkdir(parents=True)
    return outside / FOLDER, hub


@pytest.mark.parametrize("linked", ["refs", "snapshots"])
def test_a_symlinked_refs_or_snapshots_folder_is_refused_not_read_through(tmp_path, linked):
    outside, hub = _outside_repo(tmp_path)
    make_repo(hub, files={"a": b"1"}, snapshot=linked == "refs")
    if linked == "snapshots":
        (hub / FOLDER / "snapshots").symlink_to(outside / "snapshots")
    else:
        (hub / FOLDER / "refs" / "main").unlink()
        (hub / FOLDER / "refs").rmdir()
        (hub / FOLDER / "refs").symlink_to(outside / "refs")
    row = repo_status(str(hub), REPO)
    assert "symlink" in row["problem"] and str(outside / linked) in row["problem"], row
    assert row["state"] != "staged" and row["files_local"] == 0 and row["bytes_local"] == 0


def test_a_ref_under_a_symlinked_folder_of_its_revision_is_not_read(tmp_path):
    outside, hub = _outside_repo(tmp_path)
    make_repo(hub, files={"a": b"1"})
    (outside / "refs" / "v1").mkdir()
    (outside / "refs" / "v1" / "main").write_text(COMMIT)
    (hub / FOLDER / "refs" / "release").symlink_to(outside / "refs" / "v1")
    row = repo_status(str(hub), dict(REPO, revision="release/main"))
    assert row["state"] == "not staged" and row["commit"] is None and "symlink" in row["problem"]


def test_a_symlinked_locks_folder_of_the_hub_is_not_read(tmp_path):
    outside, hub = _outside_repo(tmp_path)
    make_repo(hub, files={"a": b"1"})
    (hub / ".locks").symlink_to(outside.parent / ".locks")
    row = repo_status(str(hub), REPO)
    assert row["state"] == "staged" and row["last_verified"] is None
    assert "symlink" in row["progress_problem"] and ".locks" in row["progress_problem"]


def test_links_to_missing_or_outside_content_are_dangling_not_counted(tmp_path):
    repo = make_repo(tmp_path, files={"a": b"1234"})
    snap = repo / "snapshots" / COMMIT
    (snap / "gone").symlink_to("../../blobs/nothing")
    (tmp_path / "outside.bin").write_bytes(b"x" * 99)
    (snap / "out").symlink_to(tmp_path / "outside.bin")
    row = repo_status(str(tmp_path), REPO)
    assert (row["files_local"], row["bytes_local"], row["dangling"]) == (1, 4, 2)


def test_a_verify_of_another_commit_is_said(tmp_path):
    make_repo(tmp_path, files={"a": b"1"})
    write_progress(tmp_path, {"passes": {"verify": figures("verify", "2026-11-30T21:00:00Z", "full", commit=OTHER)}})
    status = host_status(str(tmp_path), [REPO], None, [], False, "e", {})
    assert "of commit bbbbbbbbbbbb, not the staged one" in status_lines(status)[0]


def test_the_status_reads_and_writes_nothing_new(tmp_path):
    make_repo(tmp_path, files={"a": b"1"})
    write_progress(tmp_path, b"{half")
    before = tree_snapshot(str(tmp_path))
    status = host_status(str(tmp_path), [REPO], str(tmp_path / "cache"), ["r1"], False, "e", {})
    assert status["repos"][0]["progress_problem"] and tree_snapshot(str(tmp_path)) == before


@pytest.mark.parametrize("staged", [True, False])
def test_an_unreadable_progress_file_claims_neither_a_stage_nor_never_verified(tmp_path, staged):
    if staged:
        make_repo(tmp_path, files={"a": b"1"})
    write_progress(tmp_path, b"{half")
    line = status_lines(host_status(str(tmp_path), [REPO], None, [], False, "e", {}))[0]
    assert "never verified" not in line and "staged at" not in line and "staged 20" not in line
    assert line.endswith("; last stage and verify unknown: %s is not JSON: not a progress file dgx-stage wrote"
                         % os.path.join(str(tmp_path), ".locks", "models--org--model", "dgx-stage.progress.json"))
    assert line.startswith("org/model@main: " + ("commit aaaaaaaaaaaa" if staged else "not staged;"))


# --- receipts -----------------------------------------------------------------------------------------

def test_receipts_present_are_listed(tmp_path):
    (tmp_path / "ds41-combined-ready").mkdir()
    status = host_status(str(tmp_path / "hub"), [], str(tmp_path), ["ds41-backend-attestation", "ds41-combined-ready"],
                         False, "e", {})
    assert status["receipts"]["present"] == ["ds41-combined-ready"]
    assert "receipts under %s: ds41-combined-ready" % tmp_path in status_lines(status)
    assert host_status("/x", [], str(tmp_path / "none"), ["a"], False, "e", {})["receipts"]["present"] == []


# --- the engine, from captured engine_probe wait results ----------------------------------------------

def probe(container, api=False, models=(), status="ready"):
    return {"ready": api, "row": {"api": api, "models": list(models), "status": status, "container": container}}


def container(status, running=False, exists=True, exit_code=None):
    return {"name": "ds41-engine", "exists": exists, "id": "c0ffee" if exists else None, "running": running,
            "status": status, "exit_code": exit_code, "error": "" if exists else "no such container"}


def test_engine_disabled_is_not_looked_up():
    status = engine_status(False, "ds41-engine", probe(container("running", running=True), api=True))
    assert (status["state"], status["health"]) == ("disabled", "not checked")


def test_engine_running_and_healthy():
    status = engine_status(True, "ds41-engine", probe(container("running", running=True, exit_code=0), True, ["m"]))
    assert (status["state"], status["health"], status["models"], status["exit_code"]) == ("running", "ok", ["m"], None)


def test_engine_running_but_the_api_does_not_answer():
    status = engine_status(True, "ds41-engine", probe(container("running", running=True), status="connection refused"))
    assert status["health"] == "unhealthy: connection refused"


@pytest.mark.parametrize("word, state", [("exited", "exited"), ("stopped", "exited"), ("paused", "paused"),
                                         ("created", "created")])
def test_engine_not_running_is_not_health_checked(word, state):
    status = engine_status(True, "ds41-engine", probe(container(word, exit_code=3), status=word))
    assert (status["state"], status["health"]) == (state, "not checked")


def test_engine_absent_and_not_looked_up():
    status = engine_status(True, "ds41-engine", probe(container("missing", exists=False), status="missing"))
    assert status["state"] == "absent" and status["problem"] == "no such container"
    # As engine_probe reports them: docker's and podman's words, no runtime at all, a daemon that is down.
    for error, state in (("docker inspect: Error: No such object: ds41-engine", "absent"),
                         ("podman inspect: Error: no such container ds41-engine", "absent"),
                         ("podman not found on this host", "absent"),
                         ("docker inspect: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                          "Is the docker daemon running?", "unknown")):
        gone = dict(container("missing", exists=False), error=error)
        assert engine_status(True, "ds41-engine", probe(gone, status="missing"))["state"] == state, error
    assert engine_status(True, "ds41-engine", {})["state"] == "unknown"
    line = status_lines(host_status("/x", [], None, [], True, "ds41-engine",
                                    probe(container("exited", exit_code=137))))[-1]
    assert line == "engine ds41-engine: exited (exit code 137), API health: not checked"


def test_engine_states_from_captured_docker_inspect_output():
    """Docker's own `inspect` output (tests/unit/fixtures/docker), as engine_probe's wait turns it into a row."""
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "docker")

    def captured(name):
        with open(os.path.join(fixtures, name)) as handle:
            return dict(container_facts(json.load(handle)[0]), name="ds41-engine")

    running = engine_status(True, "ds41-engine", probe(captured("inspect_running.json"), True, ["ds41"]))
    assert (running["state"], running["health"], running["exit_code"]) == ("running", "ok", None)
    assert running["container_id"] and len(running["container_id"]) == 64
    exited = engine_status(True, "ds41-engine", probe(captured("inspect_exited.json"), status="exited"))
    assert (exited["state"], exited["exit_code"], exited["health"]) == ("exited", 3, "not checked")


# --- the manifest the engine binds ----------------------------------------------------------------------

def write_manifest(path, bind_from="local", commit=COMMIT):
    record = {"repo_id": REPO["repo_id"], "revision": "main", "commit": commit, "folder": FOLDER}
    document = {"repos": [record], "mounts": [], "counts": {"local": 0, "nas": 0, "total": 0}}
    if bind_from:
        document["bind_from"] = bind_from
    path.write_text(json.dumps(document))
    os.utime(str(path), (1764547200, 1764547200))
    return path


@pytest.mark.parametrize("bind_from", ["local", "nas"])
def test_the_manifest_says_its_bind_mode_and_when_it_was_written(tmp_path, bind_from):
    make_repo(tmp_path / "nas")
    manifest = manifest_status(str(write_manifest(tmp_path / "m.json", bind_from)), str(tmp_path / "nas"))
    assert (manifest["problem"], manifest["bind_from"], manifest["written"]) == (None, bind_from, "2025-12-01T00:00:00Z")
    assert manifest["repos"] == [{"repo_id": "org/model", "revision": "main", "commit": COMMIT, "nas_commit": COMMIT,
                                  "moved": False, "problem": None}]
    assert manifest_lines(manifest) == ["manifest %s: binds from %s (written 2025-12-01T00:00:00Z)"
                                        % (tmp_path / "m.json", bind_from)]


def test_a_nas_ref_moved_past_the_bound_commit_is_said_with_both_commits(tmp_path):
    make_repo(tmp_path / "nas", commit=OTHER)
    manifest = manifest_status(str(write_manifest(tmp_path / "m.json", "nas")), str(tmp_path / "nas"))
    assert (manifest["repos"][0]["moved"], manifest["repos"][0]["nas_commit"]) == (True, OTHER)
    assert manifest_lines(manifest)[1] == ("  org/model: the NAS refs/main moved past the bound commit %s to %s "
                                           "(not served yet: stage it)" % (COMMIT[:12], OTHER[:12]))


def test_a_nas_ref_that_cannot_be_read_is_named_not_called_moved(tmp_path):
    (tmp_path / "nas").mkdir()
    manifest = manifest_status(str(write_manifest(tmp_path / "m.json")), str(tmp_path / "nas"))
    assert manifest["repos"][0]["moved"] is None and manifest["repos"][0]["problem"]
    assert manifest_lines(manifest)[1] == "  org/model: NAS refs/main: no refs/main in the NAS hub"


@pytest.mark.parametrize("edit, said, line", [
    (lambda d: d.update(bind_from=5), "bind_from is 5, neither local nor nas", "  org/model: the NAS refs/main moved"),
    (lambda d: d.update(bind_from={"x": 1}), 'bind_from is {"x": 1}, neither local nor nas', "  org/model: the NAS"),
    (lambda d: d["repos"][0].update(revision=5), "repos[0].revision is 5, not text", None),
    (lambda d: d["repos"][0].update(commit=["a"]), 'repos[0].commit is ["a"], not text', None),
    (lambda d: d["repos"][0].update(repo_id={"a": 1}), 'repos[0].repo_id is {"a": 1}, not text', "  repos[0]: the NAS"),
    (lambda d: d["repos"].insert(0, ["x"]), 'repos[0] is ["x"], not an object', "  org/model: the NAS refs/main moved")])
def test_a_manifest_field_of_the_wrong_type_is_named_and_the_rest_is_read(tmp_path, edit, said, line):
    make_repo(tmp_path / "nas", commit=OTHER)
    path = write_manifest(tmp_path / "m.json")
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    args = {"hub_local_root": str(tmp_path / "local"), "repos": [REPO], "receipt_parent": str(tmp_path),
            "engine_enabled": False, "manifest_path": str(path), "hub_nas_root": str(tmp_path / "nas")}
    result = check_result("stage_status", args, run_main("stage_status", args))
    manifest = result["status"]["manifest"]
    assert manifest["problem"] is None and manifest["field_problems"] == [said]
    lines = [text for text in result["lines"] if text.startswith(("manifest ", "  "))]
    assert lines[0].startswith("manifest %s: binds from " % path) and "written before" not in lines[0]
    assert lines[1] == "  manifest field %s: not read" % said
    assert (lines[2].startswith(line) if line else len(lines) == 2), lines


@pytest.mark.parametrize("content, words", [
    (None, "not written yet"), (b"{", "not JSON"), (b"[]", "not a mount manifest"),
    (b"\xff", "not JSON")])
def test_a_missing_or_garbage_manifest_is_named_not_raised(tmp_path, content, words):
    path = tmp_path / "m.json"
    if content is not None:
        path.write_bytes(content)
    manifest = manifest_status(str(path), str(tmp_path))
    assert words in manifest["problem"] and manifest["bind_from"] is None
    assert manifest_lines(manifest) == ["manifest %s: %s" % (path, manifest["problem"])]


def test_a_manifest_behind_a_link_is_not_read_through(tmp_path):
    write_manifest(tmp_path / "real.json")
    (tmp_path / "m.json").symlink_to("real.json")
    assert manifest_status(str(tmp_path / "m.json"), str(tmp_path))["problem"] == "not a regular file"


def test_a_manifest_written_before_the_mode_was_recorded_says_so(tmp_path):
    manifest = manifest_status(str(write_manifest(tmp_path / "m.json", None)), None)
    assert manifest["bind_from"] is None and manifest["repos"][0]["nas_commit"] is None
    assert "binds from an unknown source" in manifest_lines(manifest)[0]


# --- the module ---------------------------------------------------------------------------------------

def test_stage_status_module_returns_what_it_documents(tmp_path):
    make_repo(tmp_path, files={"a": b"1"})
    write_progress(tmp_path, {"passes": "garbage"})
    args = {"hub_local_root": str(tmp_path), "repos": [REPO, {"repo_id": "org/absent"}, {"repo_id": "bad/../id"}],
            "receipt_parent": str(tmp_path), "engine_enabled": True,
            "engine_probe": probe(container("running", running=True), True, ["m"]),
            "manifest_path": str(write_manifest(tmp_path / "m.json", "nas", OTHER)), "hub_nas_root": str(tmp_path)}
    result = check_result("stage_status", args, run_main("stage_status", args))
    assert result["changed"] is False
    assert [r["state"] for r in result["status"]["repos"]] == ["staged", "not staged", "error"]
    assert result["status"]["manifest"]["bind_from"] == "nas" and result["status"]["manifest"]["repos"][0]["moved"]
    assert result["lines"][-1] == "engine ds41-engine: running, API health: ok (m)"
    assert result["lines"][-3].startswith("manifest %s: binds from nas" % (tmp_path / "m.json"))
    assert len(result["lines"]) == 7


def test_control_characters_in_a_repo_id_or_a_message_stay_on_one_line(tmp_path):
    (tmp_path / ".locks").mkdir()
    (tmp_path / ".locks" / "models--org--bad\nid").symlink_to("/elsewhere\x1b[31m")
    status = host_status(str(tmp_path), [{"repo_id": "org/bad\nid"}], None, [], False, "e", {})
    [line] = status_lines(status)[:1]
    assert "\n" not in line and "\x1b" not in line
    assert line.startswith("org/bad\\nid@main: not staged") and "/elsewhere\\x1b[31m" in line
