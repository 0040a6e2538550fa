"""File names with `:`, `,`, spaces and quotes bound into a real container (Podman, then Docker) by the engine role.

A hand-built hub holds one repo whose snapshot links (git-sha1 and sha256 named blobs) and whose
NAS-only directory (real files, never staged, bound read-only from the NAS) are named with `:`, `,`,
spaces, `=` and a double quote: exactly what `--volume src:dst:ro` strings broke. The repo is staged,
the manifest written and engine_double started through the playbook with engine_runtime=podman and =docker;
the double then reports from inside the container that every bind sits at its exact target and reads
back the right bytes. A re-run changes nothing and keeps the container; a bind path no runtime can
bind exactly as written stops the engine play before the running container is touched.
"""
import hashlib
import json
import os
import uuid

import pytest

from conftest import failures, run_playbook
from hubgen import git_blob_sha1, repo_folder, sha256_hex
from test_engine_one_rank import (build_engine_double, changed_tasks, double, free_port, lane_settings,
                                  write_lane_inventory)
from nashub import NasHub
import runtimes

REPO = "org/odd-names"
COMMIT = hashlib.sha1(b"odd-names").hexdigest()
NAS_DIR = "nas, dir:v2"           # a real-file directory left on the NAS (like page15/)
TRICKY = ["tok:v2.json", "a,b.json", "my file.json", "k=v \"q\".json"]
# snapshot-relative path -> (bytes, LFS?)
LINKED = dict([("config.json", (b'{"model_type": "double"}\n', False))]
              + [(name, (("content of %s\n" % name).encode(), False)) for name in TRICKY]
              + [("sub dir/x:y,z.json", (b'{"nested": true}\n', False)),
                 ("weights:v2, part 1.bin", (bytes(range(256)) * 64, True))])
NAS_FILES = dict(("%s/%s" % (NAS_DIR, name), ("nas bytes of %s\n" % name).encode()) for name in TRICKY)


def build_hub(root):
    """hub/models--org--odd-names: refs/main, blobs named by their hash, snapshot links, NAS-only real files."""
    repo = os.path.join(root, "hub", repo_folder(REPO))
    os.makedirs(os.path.join(repo, "refs"))
    os.makedirs(os.path.join(repo, "blobs"))
    with open(os.path.join(repo, "refs", "main"), "w") as handle:
        handle.write(COMMIT)
    snapshot = os.path.join(repo, "snapshots", COMMIT)
    for rel, (data, lfs) in LINKED.items():
        name = sha256_hex(data) if lfs else git_blob_sha1(data)
        with open(os.path.join(repo, "blobs", name), "wb") as handle:
            handle.write(data)
        path = os.path.join(snapshot, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink("../" * (rel.count("/") + 2) + "blobs/" + name, path)
    for rel, data in NAS_FILES.items():
        path = os.path.join(snapshot, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    return os.path.join(root, "hub")


def container_state(lane):
    return runtimes.container_ids(lane["runtime"], lane["name"])


@pytest.fixture(scope="module", params=runtimes.params())
def names_lane(request, tmp_path_factory):
    runtime = request.param
    build_engine_double()
    work = str(tmp_path_factory.mktemp("names-" + runtime))
    nas_root = os.path.join(work, "nas")
    hub = build_hub(nas_root)
    nas = NasHub(root=nas_root)
    nas.freeze()
    port = free_port()
    name = "dgx-stage-test-mount-names-%s-%s" % (runtime, uuid.uuid4().hex[:8])
    cache = os.path.join(work, "cache")
    os.makedirs(cache)
    settings = lane_settings(work, hub, [{"repo_id": REPO, "ignore_patterns": [NAS_DIR + "/"]}], name, port,
                             runtime, engine_master_port=29512)
    inventory = write_lane_inventory(work, settings)
    info = {"work": work, "port": port, "name": name, "cache": cache, "inventory": inventory,
            "settings": settings, "runtime": runtime}
    try:
        info["first_run"] = run_playbook(work, inventory, "--tags", "stage,receipts,manifest,engine")
        yield info
    finally:
        runtimes.remove(runtime, name)
        try:
            nas.assert_unchanged()
        finally:
            nas.thaw()


def manifest_of(lane):
    with open(lane["settings"]["engine_manifest_path"]) as handle:
        return json.load(handle)


def test_files_named_with_colons_commas_and_spaces_read_back_inside_the_container(names_lane):
    rc, data = names_lane["first_run"]
    assert rc == 0, failures(data)
    manifest = manifest_of(names_lane)
    target = manifest["repos"][0]["target"]
    local = dict((m["target"][len(target) + 1:], m) for m in manifest["mounts"] if m["origin"] == "local")
    nas = [m for m in manifest["mounts"] if m["origin"] == "nas"]
    assert sorted(local) == sorted(LINKED)
    assert [m["target"] for m in nas] == [target + "/" + NAS_DIR]

    files = [target + "/" + rel for rel in list(LINKED) + list(NAS_FILES)]
    seen = double(names_lane, "/debug/mounts", {"paths": files, "dirs": [target + "/" + NAS_DIR]})
    # Each bind sits at exactly its target (nothing split at a ':' or ','), read-only.
    mounts = dict((m["mount_point"], m) for m in seen["mounts"])
    for mount in manifest["mounts"]:
        assert mount["target"] in mounts, "%r is not mounted; mount points: %r" % (mount["target"], sorted(mounts))
        assert mounts[mount["target"]]["read_only"], mount["target"]
    # Each file reads back the bytes it was published with, local copy or NAS.
    for rel, (content, _) in LINKED.items():
        got = seen["files"][target + "/" + rel]
        assert got["readable"] and got["sha256"] == sha256_hex(content), (rel, got)
    for rel, content in NAS_FILES.items():
        got = seen["files"][target + "/" + rel]
        assert got["readable"] and got["sha256"] == sha256_hex(content), (rel, got)
    assert seen["dirs"][target + "/" + NAS_DIR] == sorted(TRICKY)
    assert seen["env"]["MODEL_PATH"] == target


def inspect_of(lane):
    return json.loads(runtimes.cli(lane["runtime"], "inspect", "--type", "container", lane["name"]).stdout.decode())[0]


def test_docker_got_api_mounts_with_the_names_intact(names_lane):
    if names_lane["runtime"] != "docker":
        pytest.skip("docker only (podman: the CSV-quoted --mount specs below)")
    inspect = inspect_of(names_lane)
    # The API's mount objects (HostConfig.Mounts, no string to split): the exact paths, read-only as asked.
    asked = dict((m["Target"], m) for m in inspect["HostConfig"]["Mounts"])
    manifest = manifest_of(names_lane)
    assert len(asked) == len(manifest["mounts"]) + 1  # + the receipt bind
    for mount in manifest["mounts"]:
        got = asked[mount["target"]]
        assert (got["Type"], got["Source"], got.get("ReadOnly")) == ("bind", mount["source"], True), got
    assert asked["/cache"]["Source"] == names_lane["cache"] and not asked["/cache"].get("ReadOnly")
    assert inspect["HostConfig"]["Binds"] in (None, [])   # never "src:dst:ro" strings
    # What the daemon bound (Mounts) agrees.
    bound = dict((m["Destination"], (m["Source"], m["RW"])) for m in inspect["Mounts"])
    assert all(bound[m["target"]] == (m["source"], False) for m in manifest["mounts"]), bound


def test_podman_got_csv_quoted_mount_specs_not_volume_strings(names_lane):
    if names_lane["runtime"] != "podman":
        pytest.skip("podman only (docker: the API mounts above)")
    inspect = inspect_of(names_lane)
    command = inspect["Config"]["CreateCommand"]
    assert "--volume" not in command and "-v" not in command
    specs = [command[i + 1] for i, arg in enumerate(command) if arg == "--mount"]
    manifest = manifest_of(names_lane)
    assert len(specs) == len(manifest["mounts"]) + 1  # + the receipt bind
    # A local file is bound from its blob (a hash name), so only its destination needs quoting;
    # the NAS directory has the comma on both sides.
    comma = [m for m in manifest["mounts"] if m["target"].endswith("/a,b.json")][0]
    assert 'type=bind,source=%s,"destination=%s",ro=true' % (comma["source"], comma["target"]) in specs
    nas = [m for m in manifest["mounts"] if m["origin"] == "nas"][0]
    assert 'type=bind,"source=%s","destination=%s",ro=true' % (nas["source"], nas["target"]) in specs
    colon = [m for m in manifest["mounts"] if m["target"].endswith("/tok:v2.json")][0]
    assert "type=bind,source=%s,destination=%s,ro=true" % (colon["source"], colon["target"]) in specs
    assert "type=bind,source=%s,destination=/cache,ro=false" % names_lane["cache"] in specs
    assert len(inspect["Config"]["Labels"]["dgx-stage.mounts-sha256"]) == 64


def test_rerun_changes_nothing_and_keeps_the_container(names_lane):
    before = container_state(names_lane)
    rc, data = run_playbook(names_lane["work"], names_lane["inventory"], "--tags", "stage,receipts,manifest,engine")
    assert rc == 0, failures(data)
    assert data["stats"]["localhost"]["changed"] == 0, changed_tasks(data)
    assert container_state(names_lane) == before


def test_a_bind_path_no_runtime_binds_exactly_stops_the_play_before_the_container_is_touched(names_lane):
    if names_lane["runtime"] != "podman":
        pytest.skip("runtime-independent (the bind check runs before any runtime task): checked on podman only")
    before = container_state(names_lane)
    cache = names_lane["cache"].rstrip("/")
    odd_parent = os.path.join(os.path.dirname(cache), ".", os.path.basename(cache))  # Podman binds it cleaned
    rc, data = run_playbook(names_lane["work"], names_lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"receipt_parent": odd_parent}))
    assert rc != 0
    assert any("its source %r" % odd_parent in f and "normal form" in f for f in failures(data)), failures(data)
    assert container_state(names_lane) == before


def test_a_trailing_slash_on_receipt_parent_is_the_same_bind(names_lane):
    before = container_state(names_lane)
    rc, data = run_playbook(names_lane["work"], names_lane["inventory"], "--tags", "engine",
                            "-e", json.dumps({"receipt_parent": names_lane["cache"].rstrip("/") + "/"}))
    assert rc == 0, failures(data)
    assert container_state(names_lane) == before
