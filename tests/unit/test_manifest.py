"""dgx_manifest: engine mount list from the NAS snapshot and what is staged locally."""
import copy
import hashlib
import json
import os

import pytest

from modrun import run_main
from treestate import manifest_text
from ansible.plugins.filter.core import to_nice_json

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_manifest import build_manifest, coverage_problems, resolve_commit
from ansible.module_utils.dgx_nodestate import bind_problems

REPO = "org/name"
FOLDER = "models--org--name"
COMMIT = "a" * 40
OLD = "b" * 40

LINKED = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
          "sub/tok.json", "sub/extra.bin"]
PAGE15 = ["page15/a/x.bin", "page15/a/y.bin", "page15/b/z.bin"]
STAGED = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
          "sub/tok.json"]


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def add_link(repo_dir, commit, rel, content):
    """snapshots/<commit>/<rel> -> ../../blobs/<sha256> (one more ../ per sub-dir)."""
    blob = os.path.join(repo_dir, "blobs", sha(content))
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    with open(blob, "w") as handle:
        handle.write(content)
    link = os.path.join(repo_dir, "snapshots", commit, rel)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    depth = rel.count("/")
    os.symlink(os.path.join(*([".."] * (2 + depth) + ["blobs", sha(content)])), link)
    return blob


def add_real(repo_dir, commit, rel, content):
    path = os.path.join(repo_dir, "snapshots", commit, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(content)


def set_ref(repo_dir, commit, name="main"):
    os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
    with open(os.path.join(repo_dir, "refs", name), "w") as handle:
        handle.write(commit)


@pytest.fixture
def hubs(tmp_path):
    """NAS hub with linked files + real page15 files; local hub with STAGED staged."""
    nas, local = tmp_path / "nas", tmp_path / "local"
    nas_repo, local_repo = str(nas / FOLDER), str(local / FOLDER)
    set_ref(nas_repo, COMMIT)
    for rel in LINKED:
        add_link(nas_repo, COMMIT, rel, "content of " + rel)
    for rel in PAGE15:
        add_real(nas_repo, COMMIT, rel, "page15 " + rel)
    set_ref(local_repo, COMMIT)
    for rel in STAGED:
        add_link(local_repo, COMMIT, rel, "content of " + rel)
    return str(local), str(nas)


def target(rel=""):
    base = "/hub/%s/snapshots/%s" % (FOLDER, COMMIT)
    return base + "/" + rel if rel else base


def nas_path(nas, rel=""):
    base = os.path.join(nas, FOLDER, "snapshots", COMMIT)
    return os.path.join(base, rel) if rel else base


def by_target(manifest):
    return {m["target"]: m for m in manifest["mounts"]}


def build(local, nas, repos=None, **kwargs):
    return build_manifest(local, nas, repos or [{"repo_id": REPO}], **kwargs)[0]


def test_staged_files_local_page15_one_dir_mount_rest_per_file(hubs):
    local, nas = hubs
    manifest = build(local, nas)
    mounts = by_target(manifest)
    assert manifest["counts"] == {"local": 4, "nas": 2, "total": 6}
    for rel in STAGED:
        mount = mounts[target(rel)]
        assert mount["origin"] == "local" and mount["read_only"] is True
        assert mount["source"] == os.path.join(local, FOLDER, "blobs", sha("content of " + rel))
    assert mounts[target("page15")] == {"source": nas_path(nas, "page15"), "target": target("page15"),
                                        "read_only": True, "origin": "nas"}
    # sub/ holds a local file, so its unstaged sibling is bound on its own, from the NAS file.
    assert mounts[target("sub/extra.bin")] == {"source": nas_path(nas, "sub/extra.bin"),
                                               "target": target("sub/extra.bin"),
                                               "read_only": True, "origin": "nas"}
    # The pre-stop check finds nothing wrong in a manifest as written, from the local disk or from the NAS.
    assert bind_problems(manifest) == [] and bind_problems(build(local, nas, bind_from="nas")) == []


def test_mounts_sorted_by_target_and_repo_record(hubs):
    local, nas = hubs
    manifest = build(local, nas)
    targets = [m["target"] for m in manifest["mounts"]]
    assert targets == sorted(targets)
    assert manifest["repos"] == [{
        "repo_id": REPO, "repo_type": "model", "revision": "main", "commit": COMMIT,
        "folder": FOLDER, "local_snapshot": os.path.join(local, FOLDER, "snapshots", COMMIT),
        "nas_snapshot": nas_path(nas), "target": target()}]


def test_custom_target_root(hubs):
    local, nas = hubs
    manifest = build(local, nas, target_root="/models/hub/")
    assert all(m["target"].startswith("/models/hub/%s/snapshots/%s/" % (FOLDER, COMMIT))
               for m in manifest["mounts"])


def test_partially_staged_page15_splits_at_the_right_level(hubs):
    local, nas = hubs
    add_real(os.path.join(local, FOLDER), COMMIT, "page15/a/x.bin", "page15 page15/a/x.bin")
    mounts = by_target(build(local, nas))
    assert mounts[target("page15/a/x.bin")]["origin"] == "local"
    assert mounts[target("page15/a/y.bin")]["source"] == nas_path(nas, "page15/a/y.bin")
    assert mounts[target("page15/b")]["source"] == nas_path(nas, "page15/b")
    assert target("page15") not in mounts and target("page15/a") not in mounts


def test_local_link_resolving_into_the_nas_is_not_local(hubs):
    local, nas = hubs
    link = os.path.join(local, FOLDER, "snapshots", COMMIT, "config.json")
    os.unlink(link)
    os.symlink(os.path.realpath(nas_path(nas, "config.json")), link)
    mount = by_target(build(local, nas))[target("config.json")]
    assert mount["origin"] == "nas" and mount["source"] == nas_path(nas, "config.json")


def test_dangling_local_link_is_not_local(hubs):
    local, nas = hubs
    os.unlink(os.path.join(local, FOLDER, "blobs", sha("content of sub/tok.json")))
    assert by_target(build(local, nas))[target("sub/tok.json")]["origin"] == "nas"


def test_local_blob_that_is_itself_a_link_is_not_local(hubs):
    # The mirror writes every local blob as a regular file; a blob that is a link (into a store, or to
    # another blob of the same size) is not what the mirror proved, so the NAS is bound.
    local, nas = hubs
    blob = os.path.join(local, FOLDER, "blobs", sha("content of config.json"))
    store = os.path.join(local, "blobs", "xx", "store-config")
    os.makedirs(os.path.dirname(store))
    os.replace(blob, store)
    os.symlink(os.path.relpath(store, os.path.dirname(blob)), blob)
    assert by_target(build(local, nas))[target("config.json")]["source"] == nas_path(nas, "config.json")


def test_nothing_local_real_files_is_one_snapshot_mount(tmp_path):
    nas = str(tmp_path / "nas")
    set_ref(os.path.join(nas, FOLDER), COMMIT)
    for rel in PAGE15:
        add_real(os.path.join(nas, FOLDER), COMMIT, rel, rel)
    manifest = build(str(tmp_path / "no-local"), nas)
    assert manifest["mounts"] == [{"source": nas_path(nas), "target": target(),
                                   "read_only": True, "origin": "nas"}]
    assert manifest["counts"] == {"local": 0, "nas": 1, "total": 1}


def test_nothing_local_blob_links_are_bound_per_file(tmp_path):
    """A dir bind of ../../blobs links would dangle in the container: bind each file instead."""
    nas = str(tmp_path / "nas")
    set_ref(os.path.join(nas, FOLDER), COMMIT)
    for rel in LINKED:
        add_link(os.path.join(nas, FOLDER), COMMIT, rel, rel)
    manifest = build(str(tmp_path / "no-local"), nas)
    assert sorted(by_target(manifest)) == sorted(target(rel) for rel in LINKED)
    assert all(m["origin"] == "nas" for m in manifest["mounts"])


def test_relative_link_inside_a_dir_keeps_the_dir_mount(tmp_path):
    nas = str(tmp_path / "nas")
    set_ref(os.path.join(nas, FOLDER), COMMIT)
    add_real(os.path.join(nas, FOLDER), COMMIT, "page15/x.bin", "x")
    os.symlink("x.bin", nas_path(nas, "page15/alias.bin"))
    add_link(os.path.join(nas, FOLDER), COMMIT, "config.json", "c")
    mounts = by_target(build(str(tmp_path / "none"), nas))
    assert sorted(mounts) == [target("config.json"), target("page15")]


def test_second_repo_and_pattern_keys_are_accepted(hubs):
    local, nas = hubs
    drafter = os.path.join(nas, "models--org--drafter")
    set_ref(drafter, OLD)
    add_real(drafter, OLD, "weights.bin", "d")
    repos = [{"repo_id": REPO, "allow_patterns": ["*"], "ignore_patterns": ["page15/"]},
             {"repo_id": "org/drafter", "revision": None}]
    manifest = build(local, nas, repos)
    assert [r["folder"] for r in manifest["repos"]] == [FOLDER, "models--org--drafter"]
    assert by_target(manifest)["/hub/models--org--drafter/snapshots/" + OLD]["origin"] == "nas"
    assert manifest["counts"]["total"] == 7


def test_repo_listed_twice_is_refused(hubs):
    local, nas = hubs
    with pytest.raises(StageError, match="listed twice"):
        build(local, nas, [{"repo_id": REPO}, {"repo_id": REPO, "revision": "main"}])


def test_empty_repos_refused(hubs):
    with pytest.raises(StageError, match="repos is empty"):
        build_manifest(hubs[0], hubs[1], [])


def test_nas_root_must_exist(tmp_path):
    with pytest.raises(StageError, match="hub_nas_root"):
        build(str(tmp_path), str(tmp_path / "nope"))


# --- commit resolution -----------------------------------------------------------------------

def test_local_ref_wins_over_nas_ref(hubs):
    local, nas = hubs
    set_ref(os.path.join(nas, FOLDER), OLD)  # the NAS moved on after staging
    assert resolve_commit(os.path.join(local, FOLDER), os.path.join(nas, FOLDER), "main") == COMMIT


def test_nas_ref_is_the_fallback(hubs):
    local, nas = hubs
    os.unlink(os.path.join(local, FOLDER, "refs", "main"))
    assert resolve_commit(os.path.join(local, FOLDER), os.path.join(nas, FOLDER), "main") == COMMIT


def test_commit_hash_revision_with_local_snapshot(hubs):
    local, nas = hubs
    os.unlink(os.path.join(local, FOLDER, "refs", "main"))
    os.unlink(os.path.join(nas, FOLDER, "refs", "main"))
    manifest = build(local, nas, [{"repo_id": REPO, "revision": COMMIT}])
    assert manifest["repos"][0]["commit"] == COMMIT and manifest["counts"]["local"] == 4


def test_unknown_revision_names_the_nas_repo_and_what_it_has(hubs):
    local, nas = hubs
    with pytest.raises(StageError) as err:
        build(local, nas, [{"repo_id": REPO, "revision": "v2"}])
    assert "unknown revision 'v2' in %s" % os.path.join(nas, FOLDER) in str(err.value)
    assert "refs there: main" in str(err.value)


def test_malformed_ref_names_the_file(hubs):
    local, nas = hubs
    set_ref(os.path.join(local, FOLDER), "not-a-commit")
    with pytest.raises(StageError, match="refs/main holds 'not-a-commit'"):
        build(local, nas)


def test_commit_without_nas_snapshot_names_the_dir(hubs):
    local, nas = hubs
    set_ref(os.path.join(local, FOLDER), OLD)
    with pytest.raises(StageError, match="points at commit %s but snapshots/%s is missing" % (OLD, OLD)):
        build(local, nas)


@pytest.mark.parametrize("revision", ["../main", "/etc/passwd"])
def test_revision_that_leaves_refs_is_refused(hubs, revision):
    with pytest.raises(StageError, match="revision"):
        build(hubs[0], hubs[1], [{"repo_id": REPO, "revision": revision}])


# --- coverage_problems -----------------------------------------------------------------------

def built(hubs):
    return build_manifest(hubs[0], hubs[1], [{"repo_id": REPO}])


def test_valid_manifest_has_no_problems(hubs):
    manifest, nas_files = built(hubs)
    assert len(nas_files) == len(LINKED) + len(PAGE15)
    assert coverage_problems(manifest, nas_files) == []


def test_unreachable_file_is_a_problem(hubs):
    manifest, nas_files = built(hubs)
    manifest["mounts"] = [m for m in manifest["mounts"] if m["target"] != target("page15")]
    problems = coverage_problems(manifest, nas_files)
    assert len(problems) == len(PAGE15)
    assert all("reachable through 0 mounts" in p for p in problems)


def test_shared_target_is_a_problem(hubs):
    manifest, nas_files = built(hubs)
    manifest["mounts"].append(copy.deepcopy(by_target(manifest)[target("config.json")]))
    assert any("share target %s" % target("config.json") in p
               for p in coverage_problems(manifest, nas_files))


def test_target_nested_in_directory_mount_is_a_problem(hubs):
    manifest, nas_files = built(hubs)
    manifest["mounts"].append({"source": nas_path(hubs[1], "page15/a/x.bin"),
                               "target": target("page15/a/x.bin"), "read_only": True, "origin": "nas"})
    problems = coverage_problems(manifest, nas_files)
    assert any("nested inside directory mount %s" % target("page15") in p for p in problems)
    assert any("reachable through 2 mounts" in p for p in problems)


def test_writable_nas_mount_is_a_problem(hubs):
    manifest, nas_files = built(hubs)
    by_target(manifest)[target("page15")]["read_only"] = False
    assert any("not read_only" in p for p in coverage_problems(manifest, nas_files))


def test_missing_source_is_a_problem(hubs):
    manifest, nas_files = built(hubs)
    os.unlink(by_target(manifest)[target("config.json")]["source"])
    assert any("does not exist" in p for p in coverage_problems(manifest, nas_files))


def test_dir_mount_over_blob_links_is_a_problem(hubs):
    """What a naive 'bind the whole unstaged dir' would do to ../../../blobs links."""
    manifest, nas_files = built(hubs)
    manifest["mounts"] = [m for m in manifest["mounts"] if "/sub/" not in m["target"]]
    manifest["mounts"].append({"source": nas_path(hubs[1], "sub"), "target": target("sub"),
                               "read_only": True, "origin": "nas"})
    problems = coverage_problems(manifest, nas_files)
    assert any("sub/tok.json is a symlink leaving directory mount" in p for p in problems)


def test_file_outside_listed_repos_is_a_problem(hubs):
    manifest, nas_files = built(hubs)
    assert coverage_problems(manifest, nas_files + ["/elsewhere/file"]) == [
        "/elsewhere/file is not in any listed repo's NAS snapshot"]


# --- rendering --------------------------------------------------------------------------------

def test_render_matches_the_roles_to_nice_json_template(hubs):
    manifest = build(*hubs)
    text = manifest_text(manifest)
    assert text == to_nice_json(manifest, indent=2)
    assert json.loads(text) == manifest
    assert text.index('"counts"') < text.index('"mounts"') < text.index('"repos"')


def test_the_module_returns_the_manifest_as_computed(hubs):
    # The role renders the module's result: it must be build_manifest's manifest, mounts sorted, counts as is.
    local, nas = hubs
    result = run_main("engine_manifest", {"hub_local_root": local, "hub_nas_root": nas, "repos": [{"repo_id": REPO}]})
    assert result["changed"] is False
    assert result["manifest"] == build(local, nas)
    assert result["counts"] == result["manifest"]["counts"]


# ------------------------------------------------------------------------------------------------
# the mirror's rules: one link-chain walker for both modules
# ------------------------------------------------------------------------------------------------

def test_nas_link_to_a_host_file_is_refused_not_bound(hubs):
    local, nas = hubs
    os.symlink("/etc/hostname", nas_path(nas, "hostname.txt"))
    with pytest.raises(StageError, match=r"hostname\.txt resolves to .*outside the source hub root"):
        build(local, nas)


def test_nas_link_escaping_the_nas_hub_is_refused(hubs, tmp_path):
    local, nas = hubs
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the hub's")
    os.symlink(os.path.relpath(str(outside), nas_path(nas, "sub")), nas_path(nas, "sub/leak.bin"))
    with pytest.raises(StageError, match=r"sub/leak\.bin resolves to .*outside the source hub root"):
        build(local, nas)


def test_dangling_nas_link_is_refused(hubs):
    local, nas = hubs
    os.symlink("../../blobs/" + "0" * 64, nas_path(nas, "gone.bin"))
    with pytest.raises(StageError, match=r"gone\.bin is a dangling link"):
        build(local, nas)


def test_local_link_to_the_wrong_same_size_blob_is_not_local(hubs):
    # size-based dedup bound the wrong shard: both shards have the same size, the local link names
    # the other one. The NAS entry's blob name decides, not the size.
    local, nas = hubs
    one, two = LINKED[1], LINKED[2]
    assert len("content of " + one) == len("content of " + two)
    link = os.path.join(local, FOLDER, "snapshots", COMMIT, one)
    os.unlink(link)
    os.symlink("../../blobs/" + sha("content of " + two), link)
    mounts = by_target(build(local, nas))
    assert mounts[target(one)] == {"source": nas_path(nas, one), "target": target(one),
                                   "read_only": True, "origin": "nas"}
    assert mounts[target(two)]["origin"] == "local"


def test_local_blob_of_another_size_is_not_local(hubs):
    local, nas = hubs
    blob = os.path.join(local, FOLDER, "blobs", sha("content of config.json"))
    with open(blob, "a") as handle:
        handle.write("truncated-then-padded")
    assert by_target(build(local, nas))[target("config.json")]["origin"] == "nas"


def test_nas_link_to_another_snapshot_file_is_bound_from_its_blob(hubs):
    local, nas = hubs
    os.symlink("tok.json", nas_path(nas, "sub/tok-alias.json"))
    local_alias = os.path.join(local, FOLDER, "snapshots", COMMIT, "sub", "tok-alias.json")
    os.symlink("../../../blobs/" + sha("content of sub/tok.json"), local_alias)
    mounts = by_target(build(local, nas))
    assert mounts[target("sub/tok-alias.json")]["origin"] == "local"
    assert mounts[target("sub/tok-alias.json")]["source"] == mounts[target("sub/tok.json")]["source"]


def test_a_file_name_no_runtime_can_bind_is_refused_by_name(hubs):
    local, nas = hubs
    add_link(os.path.join(nas, FOLDER), COMMIT, "odd\nname.json", "content of odd name")
    with pytest.raises(StageError, match=r"mount source .*odd\\nname\.json.*newline"):
        build(local, nas)


def test_nas_blob_that_changed_size_after_staging_does_not_displace_the_local_copy(hubs):
    local, nas = hubs
    real = os.path.realpath(nas_path(nas, "config.json"))
    with open(real, "a") as handle:
        handle.write(" padded on the NAS")
    mount = by_target(build(local, nas))[target("config.json")]
    assert mount["origin"] == "local"
    assert mount["source"] == os.path.join(local, FOLDER, "blobs", sha("content of config.json"))


def test_local_link_for_a_real_nas_file_is_not_local(hubs):
    local, nas = hubs
    add_link(os.path.join(local, FOLDER), COMMIT, "page15/a/x.bin", "page15 page15/a/x.bin")
    mounts = by_target(build(local, nas))
    assert mounts[target("page15")]["origin"] == "nas" and target("page15/a/x.bin") not in mounts


def test_nas_snapshot_dir_linked_outside_the_hub_is_refused(hubs, tmp_path):
    local, nas = hubs
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the hub's")
    snapshot = nas_path(nas)
    os.rename(snapshot, str(tmp_path / "moved"))
    os.symlink(str(outside), snapshot)
    with pytest.raises(StageError, match="outside the source hub root"):
        build(local, nas)


def test_dangling_link_in_a_nas_bound_folder_is_refused_by_name(hubs):
    local, nas = hubs
    os.symlink("missing.bin", nas_path(nas, "page15/b/gone.bin"))
    with pytest.raises(StageError, match=r"page15/b/gone\.bin is a dangling link"):
        build(local, nas)


def plan_row(excluded=PAGE15, commit=COMMIT, repo_id=REPO, pruned=()):
    """The stage pass's report row as the manifest play passes it in check mode (extra keys ignored)."""
    return {"repo_id": repo_id, "repo_type": "model", "revision": "main", "commit": commit,
            "excluded_paths": list(excluded), "pruned": list(pruned), "status": "check", "blobs": {"copied": 1}}


def test_check_mode_plan_binds_what_the_stage_pass_will_copy(tmp_path, hubs):
    """A fresh node (no local hub): the plan's selected files are predicted local at the stage pass's
    paths; excluded page15 stays one NAS directory mount, as the real run will write it. The manifest
    itself is what the file will hold; the planned targets are listed beside it."""
    _local, nas = hubs
    fresh = str(tmp_path / "fresh")
    manifest = build(fresh, nas, plan=[plan_row()])
    mounts = by_target(manifest)
    assert manifest["counts"] == {"local": 5, "nas": 1, "total": 6}
    assert sorted(manifest["planned"]) == sorted(target(rel) for rel in LINKED)
    for rel in LINKED:
        assert mounts[target(rel)] == {"source": os.path.join(fresh, FOLDER, "blobs", sha("content of " + rel)),
                                       "target": target(rel), "read_only": True, "origin": "local"}
    assert mounts[target("page15")]["origin"] == "nas"


def test_check_mode_plan_keeps_what_is_already_local_unplanned(hubs):
    local, nas = hubs
    manifest = build(local, nas, plan=[plan_row()])
    assert manifest["planned"] == [target("sub/extra.bin")]
    assert manifest["repos"] == build(local, nas)["repos"] and manifest["counts"]["local"] == 5
    assert by_target(manifest)[target("sub/extra.bin")]["origin"] == "local"


def test_an_empty_plan_on_a_staged_node_predicts_the_same_manifest(hubs):
    """--check on a node with nothing to do must not show a manifest change."""
    local, nas = hubs
    add_link(os.path.join(local, FOLDER), COMMIT, "sub/extra.bin", "content of sub/extra.bin")
    manifest = build(local, nas, plan=[plan_row()])
    assert manifest.pop("planned") == [] and manifest == build(local, nas)


@pytest.mark.parametrize("row", [plan_row(repo_id="org/other"), dict(plan_row(), revision="v2")])
def test_a_plan_for_another_repo_or_revision_plans_nothing(tmp_path, hubs, row):
    _local, nas = hubs
    manifest = build(str(tmp_path / "fresh"), nas, plan=[row])
    assert manifest["planned"] == [] and manifest["counts"]["local"] == 0


def test_the_plan_commit_wins_when_the_nas_ref_moved(hubs):
    """The local ref still names the staged commit; the stage pass would stage the NAS's new one."""
    local, nas = hubs
    nas_repo = os.path.join(nas, FOLDER)
    add_link(nas_repo, OLD, "config.json", "new config")
    set_ref(nas_repo, OLD)
    manifest = build(local, nas, plan=[plan_row(commit=OLD, excluded=[])])
    assert [r["commit"] for r in manifest["repos"]] == [OLD]
    assert [m["target"] for m in manifest["mounts"]] == ["/hub/%s/snapshots/%s/config.json" % (FOLDER, OLD)]
    assert manifest["planned"] == [manifest["mounts"][0]["target"]]


def test_a_local_file_the_stage_pass_would_prune_is_predicted_from_the_nas(hubs):
    local, nas = hubs
    local_repo = os.path.join(local, FOLDER)
    snapshot_link = os.path.join(local_repo, "snapshots", COMMIT, "sub", "tok.json")
    blob = os.path.join(local_repo, "blobs", sha("content of sub/tok.json"))
    row = plan_row(excluded=PAGE15 + ["sub/tok.json"], pruned=[snapshot_link, blob])
    mounts = by_target(build(local, nas, plan=[row]))
    assert mounts[target("sub/tok.json")]["origin"] == "nas"
    kept = plan_row(excluded=PAGE15 + ["sub/tok.json"])      # prune off: the stale copy stays and is bound
    assert by_target(build(local, nas, plan=[kept]))[target("sub/tok.json")]["origin"] == "local"


def test_planned_real_files_are_bound_at_their_snapshot_path(tmp_path, hubs):
    _local, nas = hubs
    fresh = str(tmp_path / "fresh")
    mounts = by_target(build(fresh, nas, plan=[plan_row(excluded=[])]))
    assert mounts[target("page15/a/x.bin")]["source"] == os.path.join(
        fresh, FOLDER, "snapshots", COMMIT, "page15", "a", "x.bin")
    assert target("page15") not in mounts


def test_a_planned_source_is_excused_only_in_the_plan(tmp_path, hubs):
    _local, nas = hubs
    manifest = build(str(tmp_path / "fresh"), nas, plan=[plan_row()])
    planned_sources = set(by_target(manifest)[t]["source"] for t in manifest["planned"])
    _, nas_files = build_manifest(str(tmp_path / "fresh"), nas, [{"repo_id": REPO}], plan=[plan_row()])
    assert coverage_problems(manifest, nas_files, planned_sources) == []
    problems = coverage_problems(manifest, nas_files)
    assert len(problems) == len(planned_sources) and all("does not exist" in p for p in problems)


# --- engine_bind_from: nas (a lane rolled back to the NAS weights) -------------------------------------------

def load_filters(name):
    """The engine role's filter plugin roles/engine/filter_plugins/<name>.py, as the role uses it."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "roles", "engine", "filter_plugins", name + ".py")
    spec = importlib.util.spec_from_file_location("%s_filters_under_test" % name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bind_from_nas_binds_every_snapshot_file_once_read_only_from_the_nas(hubs):
    local, nas = hubs
    manifest, nas_files = build_manifest(local, nas, [{"repo_id": REPO}], bind_from="nas")
    assert manifest["counts"] == {"local": 0, "nas": 6, "total": 6}
    assert all(m["origin"] == "nas" and m["read_only"] is True for m in manifest["mounts"])
    assert all(m["source"].startswith(nas_path(nas) + os.sep) for m in manifest["mounts"])
    assert coverage_problems(manifest, nas_files) == []
    # Exactly one mount per file: the staged files are bound one by one from the NAS snapshot links,
    # the unstaged page15 pack stays one directory mount.
    mounts = by_target(manifest)
    assert sorted(mounts) == sorted([target(rel) for rel in LINKED] + [target("page15")])
    for rel in LINKED:
        assert mounts[target(rel)]["source"] == nas_path(nas, rel)
    targets = [m["target"] for m in manifest["mounts"]]
    assert len(targets) == len(set(targets)) and targets == sorted(targets)
    # The same repo records and targets as the local manifest: the engine sees the same paths.
    assert manifest["repos"] == build(local, nas)["repos"]


def test_bind_from_local_is_the_default_and_binds_the_staged_copies(hubs):
    local, nas = hubs
    assert build(local, nas, bind_from="local") == build(local, nas)
    assert build(local, nas)["counts"]["local"] == len(STAGED)


def test_bind_from_nas_reads_nothing_of_the_local_hub(hubs):
    """Suspect local disks: a local ref naming another commit, a broken ref or a rotten blob change nothing;
    the commit is the NAS's (with local, the local ref would win and this NAS has no such snapshot)."""
    local, nas = hubs
    local_repo = os.path.join(local, FOLDER)
    set_ref(local_repo, OLD)
    add_link(local_repo, OLD, "config.json", "an older config")
    with open(os.path.join(local_repo, "blobs", sha("content of config.json")), "w") as handle:
        handle.write("rotten")
    with pytest.raises(StageError, match="NAS has no snapshot"):
        build(local, nas)
    manifest = build(local, nas, bind_from="nas")
    assert [r["commit"] for r in manifest["repos"]] == [COMMIT]
    assert manifest["counts"] == {"local": 0, "nas": 6, "total": 6}
    assert not any(m["source"].startswith(local + os.sep) for m in manifest["mounts"])


def test_bind_from_nas_without_a_local_hub(tmp_path, hubs):
    _local, nas = hubs
    manifest = build(str(tmp_path / "no-local"), nas, bind_from="nas")
    assert manifest["counts"] == {"local": 0, "nas": 6, "total": 6}


def test_bind_from_nas_ignores_the_stage_plan_in_check_mode(tmp_path, hubs):
    _local, nas = hubs
    manifest = build(str(tmp_path / "fresh"), nas, plan=[plan_row()], bind_from="nas")
    assert manifest["planned"] == [] and manifest["counts"]["local"] == 0


def test_switching_bind_from_restarts_the_lane_through_the_mounts_digest(hubs):
    """The engine role labels each container with the digest of its binds (vars/main.yml: _engine_binds |
    dgx_podman_mount_specs | dgx_mounts_digest); a change of engine_bind_from changes it both ways, so the next
    engine play restarts the lane ("mounts changed"), while the same setting leaves it alone."""
    local, nas = hubs
    lane = mounts_filters = load_filters("engine_lane")
    receipts = [{"source": "/cache", "target": "/cache", "read_only": False}]

    def labels(bind_from):
        binds = mounts_filters.dgx_binds(build(local, nas, bind_from=bind_from)["mounts"], receipts)
        digest = mounts_filters.dgx_mounts_digest(mounts_filters.dgx_podman_mount_specs(binds))
        return lane.dgx_engine_labels({
            "lane": "exl3_2x", "lane_hosts": ["dgx1"], "rank": 0, "world_size": 1, "port": 8000, "run_id": "r1",
            "image": "localhost/engine:1", "image_id": "sha256:" + "1" * 64, "command": [], "env": {},
            "mounts": digest, "files": "f", "devices": []})

    def reasons(running, wanted):
        own = {"running": True, "restart_policy": None, "labels": labels(running)}
        return lane.dgx_restart_reasons(own, labels(wanted))

    assert reasons("local", "local") == [] and reasons("nas", "nas") == []
    assert reasons("local", "nas") == ["mounts changed"]
    assert reasons("nas", "local") == ["mounts changed"]


def test_a_local_folder_that_is_a_link_binds_its_files_from_the_nas_and_says_why(hubs, tmp_path):
    """snapshots/<c>/page15 (real files, staged) swapped for a link to same-size look-alikes elsewhere: they are
    not the staged copies; the NAS is bound and the manifest says why."""
    local, nas = hubs
    linked = "page15"
    snapshot = os.path.join(local, FOLDER, "snapshots", COMMIT)
    for rel in PAGE15:
        add_real(os.path.join(local, FOLDER), COMMIT, rel, "page15 " + rel)     # staged, same size
    elsewhere = tmp_path / "elsewhere"
    os.rename(os.path.join(snapshot, linked), str(elsewhere))
    os.symlink(str(elsewhere), os.path.join(snapshot, linked))
    manifest = build(local, nas)
    covered = [m for m in manifest["mounts"] if m["target"].startswith(target(linked))]
    assert covered and all(m["origin"] == "nas" and m["source"].startswith(nas_path(nas, linked)) for m in covered)
    assert all("%s is a symlink to %s" % (os.path.join(snapshot, linked), elsewhere) in m["fallback_reason"]
               for m in covered)
    assert not any(str(elsewhere) in m["source"] for m in manifest["mounts"])
    assert coverage_problems(manifest, [nas_path(nas, rel) for rel in LINKED + PAGE15]) == []


@pytest.mark.parametrize("mounted", ["blobs folder", "one blob"])
def test_a_bind_mount_in_the_local_repo_binds_its_files_from_the_nas_and_says_why(hubs, tmp_path, mounted):
    """blobs/ (or one blob) of the local repo showing same-named, same-size files from elsewhere (a bind
    mount: no link to see, one name each): they are not the staged copies; the NAS is bound, saying why."""
    from mountns import bind_mount, in_private_mount_namespace

    local, nas = hubs
    blobs = os.path.join(local, FOLDER, "blobs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in os.listdir(blobs):
        (elsewhere / name).write_bytes(b"\0" * os.path.getsize(os.path.join(blobs, name)))
    one = sorted(os.listdir(blobs))[0]
    source, mount_point = (elsewhere, blobs) if mounted == "blobs folder" else \
        (elsewhere / one, os.path.join(blobs, one))

    def build_over_the_mount():
        bind_mount(source, mount_point)
        manifest = build(local, nas)
        shown = [m for m in manifest["mounts"] if m["origin"] == "local" and
                 os.path.realpath(m["source"]).startswith(str(mount_point))]
        assert shown == [], shown
        reasons = [m.get("fallback_reason", "") for m in manifest["mounts"]]
        assert any("%s is a mount point" % mount_point in r for r in reasons), reasons

    assert in_private_mount_namespace(build_over_the_mount) == 0
