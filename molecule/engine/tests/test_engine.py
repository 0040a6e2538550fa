"""engine: two ranks of the lane as two engine_double containers on this machine's Podman, started
by the engine role from the manifest. Each rank is asked, from inside its container (the double's
debug endpoints), what it sees: the rank environment, every manifest bind read-only and holding the
NAS file's bytes, page15 through the NAS bind, a write refused. Then the host reports (smoke and
decode results) and this run's receipts."""
import errno
import json
import os
import subprocess
import sys
import urllib.request

import pytest

import dgxcheck

RANKS = ["dgx1", "dgx2"]
MAIN_REPO = "coolbho3k/DeepSeek-V4.1-Flash-EXL3-3bpw"


def ask(port, path, payload=None):
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read().decode())


@pytest.fixture(scope="module", params=RANKS)
def rank(request):
    """One rank: its inventory vars, manifest, and what its container sees of every NAS file."""
    name = request.param
    hvars = dgxcheck.inventory_vars(name)
    with open(hvars["engine_manifest_path"]) as handle:
        manifest = json.load(handle)
    expected = {}
    for repo, info in zip(hvars["stage_repos"], manifest["repos"]):
        commit, files = dgxcheck.nas_snapshot(hvars["hub_nas_root"], repo)
        assert info["target"].endswith("/" + commit)
        for rel, nas in files.items():
            expected[info["target"] + "/" + rel] = nas["sha256"]
    seen = ask(hvars["engine_port"], "/debug/mounts", {"paths": sorted(expected)})
    return {"name": name, "index": RANKS.index(name), "vars": hvars, "manifest": manifest,
            "expected": expected, "seen": seen}


def test_rank_environment(rank):
    main = [r for r in rank["manifest"]["repos"] if r["repo_id"] == MAIN_REPO][0]
    assert rank["seen"]["env"] == {
        "RANK": str(rank["index"]), "WORLD_SIZE": "2", "MASTER_ADDR": "dgx1", "MASTER_PORT": "29500",
        "HF_HUB_OFFLINE": "1", "MODEL_PATH": main["target"]}


def test_every_manifest_bind_is_mounted_read_only(rank):
    mounts = dict((m["mount_point"], m) for m in rank["seen"]["mounts"])
    problems = []
    for bind in rank["manifest"]["mounts"]:
        got = mounts.get(bind["target"])
        if got is None:
            problems.append("%s is not mounted in %s's container" % (bind["target"], rank["name"]))
        elif not got["read_only"]:
            problems.append("%s is mounted read-write" % bind["target"])
    dgxcheck.ok(problems)
    assert mounts["/cache"]["read_only"] is False, "the engine writes its receipts to /cache"


def test_every_nas_file_reads_back_its_bytes_inside_the_container(rank):
    files = rank["seen"]["files"]
    dgxcheck.ok(["%s: %s" % (path, files[path]["error"] or "sha256 %s" % files[path]["sha256"])
                 for path, sha in sorted(rank["expected"].items())
                 if not files[path]["readable"] or files[path]["sha256"] != sha])
    page15 = [p for p in rank["expected"] if "/page15/" in p]
    assert page15, "set-up: no page15 files in the NAS snapshot"


def test_nas_and_local_binds_refuse_writes(rank):
    nas = [m for m in rank["manifest"]["mounts"] if m["origin"] == "nas"]
    local = [m for m in rank["manifest"]["mounts"] if m["origin"] == "local"]
    assert nas and local
    for bind in (nas[0], local[0]):
        attempt = ask(rank["vars"]["engine_port"], "/debug/try-write", {"path": bind["target"]})
        assert attempt["ok"] is False and attempt["errno"] == errno.EROFS, (bind, attempt)


def test_manifest_covers_every_nas_file_once(rank):
    hvars = rank["vars"]
    sources = [m["source"] for m in rank["manifest"]["mounts"] if m["origin"] == "local"]
    answer = _local_probe(hvars["hub_local_root"], sources)
    dgxcheck.ok(dgxcheck.check_manifest(rank["manifest"], answer["stat"], hvars["hub_nas_root"],
                                        os.path.realpath(hvars["hub_local_root"]), hvars["stage_repos"]))


def test_report_has_the_rank_smoke_and_decode_results(rank):
    engine = dgxcheck.report(rank["name"])["engine"]
    assert (engine["runtime"], engine["rank"], engine["world_size"], engine["master_addr"]) == \
        ("podman", rank["index"], 2, "dgx1")
    assert engine["name"] == rank["vars"]["engine_name"]
    smoke, decode = engine["smoke"], engine["decode"]
    assert smoke["passed"] is True and "11303" in smoke["answer"], smoke
    assert decode["tokens"] == 400 and decode["passed"] is True, decode
    assert decode["decode_tok_s"] >= decode["floor"] == 30.78, decode


def test_receipts_are_this_runs(rank):
    parent = rank["vars"]["receipt_parent"]
    for root in dgxcheck.RECEIPT_ROOTS:
        path = os.path.join(parent, root)
        assert os.path.isdir(path) and not os.path.islink(path), "%s: not this run's receipt dir" % path
        with open(os.path.join(path, "worker.json")) as handle:
            worker = json.load(handle)
        assert worker.get("rank") == str(rank["index"]) and "run" not in worker, worker
    with open(os.path.join(parent, "keep", "display-kv", "worker.json")) as handle:
        assert json.load(handle) == {"keep": True}, "the old symlinked root's target was touched"


def test_each_rank_is_its_own_container():
    names = [dgxcheck.inventory_vars(r)["engine_name"] for r in RANKS]
    out = subprocess.run(["podman", "inspect", "--format", "{{.Name}} {{.State.Running}} {{.HostConfig.NetworkMode}}"]
                         + names, stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert sorted(out.split("\n")[:2]) == sorted("%s true host" % n for n in names), out


def test_nas_unchanged_byte_for_byte():
    dgxcheck.ok(dgxcheck.nas_unchanged())


def _local_probe(root, stat_paths):
    args = [sys.executable, os.path.join(dgxcheck.HERE, "probe.py"), root]
    for path in stat_paths:
        args += ["--stat", path]
    return json.loads(subprocess.run(args, stdout=subprocess.PIPE, check=True).stdout.decode())
