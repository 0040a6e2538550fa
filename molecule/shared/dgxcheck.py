"""Checks shared by the scenarios' testinfra tests: the truth is recomputed from the NAS (read on the controller)
and from a probe of each node, never taken from a module's report (only the receipt root names, settings, come
from dgx_receipts). Every check returns its problems, so a failing test names all of them."""
import fnmatch
import json
import os
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(os.path.dirname(HERE))
NAS_ROOT = os.path.join(PROJECT, ".cache", "molecule", "nas")
sys.path[:0] = [PROJECT, os.path.join(PROJECT, "tools"), os.path.join(PROJECT, "tests")]  # hubgen, test oracles

from dgx_stage import use_module_utils  # noqa: E402
from hubgen import repo_folder  # noqa: E402
from treestate import sha256_file  # noqa: E402

use_module_utils()
# The names the engine writes and the plays clear.
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS  # noqa: E402

with open(os.path.join(HERE, "probe.py")) as _handle:
    PROBE_SOURCE = _handle.read()


def ok(problems):
    """The test's assertion: no problems, else all of them, one a line."""
    assert not problems, "\n".join(problems)


def ephemeral_dir():
    return os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]


def inventory_vars(host):
    """The host's variables as molecule wrote them (group_vars/all, then host_vars/<host>)."""
    inventory = os.path.join(ephemeral_dir(), "inventory")
    merged = {}
    for path in (os.path.join(inventory, "group_vars", "all"), os.path.join(inventory, "host_vars", host)):
        if os.path.isfile(path):
            with open(path) as handle:
                merged.update(yaml.safe_load(handle) or {})
    return merged


def probe(host, root, stat_paths=(), read_paths=()):
    """Run probe.py on a testinfra host; returns its JSON answer."""
    args = [root] + [a for p in stat_paths for a in ("--stat", p)] + [a for p in read_paths for a in ("--read", p)]
    cmd = host.run("python3 -c %s " + " ".join(["%s"] * len(args)), PROBE_SOURCE, *args)
    assert cmd.rc == 0, "probe failed on %s: %s" % (host.backend.get_pseudo_hostname(), cmd.stderr)
    return json.loads(cmd.stdout)


def probe_node(host, extra_stat_paths=lambda hvars: []):
    """(name, inventory vars, probe answer with "manifest") of one node: a first probe reads its mount manifest, the
    second stats the local sources it binds (plus extra_stat_paths(hvars)) and reads its refs."""
    name = host.backend.name
    hvars = inventory_vars(name)
    manifest_path = hvars["engine_manifest_path"]
    first = probe(host, hvars["hub_local_root"], read_paths=[manifest_path])
    manifest = json.loads(first["read"][manifest_path] or "null")
    sources = [m["source"] for m in (manifest or {}).get("mounts", []) if m["origin"] == "local"]
    answer = probe(host, hvars["hub_local_root"], stat_paths=sources + list(extra_stat_paths(hvars)),
                   read_paths=ref_paths(hvars["hub_local_root"], hvars["stage_repos"]))
    answer["manifest"] = manifest
    return name, hvars, answer


def report(host_name):
    with open(os.path.join(inventory_vars(host_name)["stage_report_dir"], host_name + ".json")) as handle:
        return json.load(handle)


def _folder(repo):
    return repo_folder(repo["repo_id"], repo.get("repo_type", "model"))


def nas_snapshot(nas_root, repo):
    """(commit, {snapshot-relative path: {"sha256", "size", "kind": "link"|"real"}}) of a repo revision."""
    repo_dir = os.path.join(nas_root, _folder(repo))
    commit = repo.get("revision", "main")
    if os.path.isfile(os.path.join(repo_dir, "refs", commit)):
        with open(os.path.join(repo_dir, "refs", commit)) as handle:
            commit = handle.read().strip()
    snap = os.path.join(repo_dir, "snapshots", commit)
    files = {}
    for dirpath, _dirs, names in os.walk(snap):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, snap)
            files[rel] = {"sha256": sha256_file(full), "size": os.path.getsize(full),
                          "kind": "link" if os.path.islink(full) else "real"}
    return commit, files


def _matches(path, patterns):
    return any(fnmatch.fnmatchcase(path, p + "*" if p.endswith("/") else p) for p in patterns or ())


def selected(path, allow_patterns, ignore_patterns):
    """huggingface_hub's filter_repo_objects: fnmatch on the relative path, 'dir/' means everything below."""
    return (not allow_patterns or _matches(path, allow_patterns)) and not _matches(path, ignore_patterns)


def check_blobs(answer):
    """Every local blob is a regular file with one link whose content hashes to its name."""
    problems, seen = [], 0
    for rel, entry in sorted(answer["tree"].items()):
        parts = rel.split(os.sep)
        if len(parts) != 3 or parts[1] != "blobs":
            continue
        seen += 1
        name = parts[2]
        if entry["type"] != "file":
            problems.append("%s is a %s, not a regular file" % (rel, entry["type"]))
            continue
        if entry["nlink"] != 1:
            problems.append("%s has %d hard links (size-based dedup binds wrong shards)" % (rel, entry["nlink"]))
        key, label = {64: ("sha256", "sha256"), 40: ("gitsha1", "git blob sha1")}.get(len(name), (None, None))
        if key is None:
            problems.append("%s: not named by a hash (debris?)" % rel)
        elif entry[key] != name:
            problems.append("%s: content %s is %s" % (rel, label, entry[key]))
    if not seen:
        problems.append("no blobs under the local hub at all")
    return problems


def check_all_local(answer, nas_root):
    """Nothing under the local hub resolves outside it, into the NAS, or onto another device."""
    problems = []
    root = answer["root"]["real"]
    nas_real = os.path.realpath(nas_root)
    for rel, entry in sorted(answer["tree"].items()):
        real = entry["real"]
        if real == nas_real or real.startswith(nas_real + "/"):
            problems.append("%s resolves into the NAS: %s" % (rel, real))
        elif not (real == root or real.startswith(root + "/")):
            problems.append("%s resolves outside the local hub: %s" % (rel, real))
        if entry["type"] == "link" and os.path.isabs(entry["link"]):
            problems.append("%s is an absolute link (%s): the hub must be relocatable" % (rel, entry["link"]))
        if entry["type"] != "link" and entry["dev"] != answer["root"]["dev"]:
            problems.append("%s lives on another device than the local hub" % rel)
    return problems


def check_snapshot(answer, nas_root, local_root, repo):
    """The local snapshot holds exactly the selected files, each resolving to its NAS content;
    excluded files (page15) are absent, under their own name and as content anywhere."""
    problems = []
    commit, files = nas_snapshot(nas_root, repo)
    snap = os.path.join(_folder(repo), "snapshots", commit)
    tree = answer["tree"]
    by_real = {entry["real"]: entry for entry in tree.values() if entry["type"] == "file"}
    local_contents = set(e["sha256"] for e in by_real.values())
    wanted = 0
    for rel, nas in sorted(files.items()):
        local = tree.get(os.path.join(snap, rel))
        if selected(rel, repo.get("allow_patterns"), repo.get("ignore_patterns")):
            wanted += 1
            if local is None:
                problems.append("%s@%s: %s is missing locally" % (repo["repo_id"], commit[:8], rel))
                continue
            if local["type"] != "link":
                problems.append("%s: %s is a %s, not a link into blobs/" % (repo["repo_id"], rel, local["type"]))
            target = by_real.get(local["real"])
            if target is None:
                problems.append("%s: %s does not resolve to a local file" % (repo["repo_id"], rel))
            elif target["sha256"] != nas["sha256"]:
                problems.append("%s: %s resolves to other content than on the NAS" % (repo["repo_id"], rel))
        else:
            if local is not None:
                problems.append("%s: excluded %s exists locally (%s)" % (repo["repo_id"], rel, local["type"]))
            if nas["sha256"] in local_contents:
                problems.append("%s: the content of excluded %s was copied to the local disk"
                                % (repo["repo_id"], rel))
    ref = answer["read"].get(ref_paths(local_root, [repo])[0])
    if ref is None:
        problems.append("%s: no local refs/%s (offline loading of it fails)" % (repo["repo_id"],
                                                                                 repo.get("revision", "main")))
    elif ref.strip() != commit:
        problems.append("%s: local refs/%s is %r, NAS has %s" % (repo["repo_id"], repo.get("revision", "main"),
                                                                 ref, commit))
    if not wanted:
        problems.append("%s: the patterns select nothing (test set-up error)" % repo["repo_id"])
    return problems


def check_snapshots(answer, hvars):
    """check_snapshot for every repo the host stages (hvars: its inventory variables)."""
    return [problem for repo in hvars["stage_repos"]
            for problem in check_snapshot(answer, hvars["hub_nas_root"], hvars["hub_local_root"], repo)]


def ref_paths(local_root, repos):
    return [os.path.join(local_root, _folder(r), "refs", r.get("revision", "main")) for r in repos]


def check_manifest(manifest, answer_sources, nas_root, local_root, repos):
    """Every NAS snapshot file is reachable through exactly one mount, with its NAS content;
    NAS binds are read-only and come from the NAS; local binds come from local regular files."""
    problems = _mount_list_problems(manifest, answer_sources, nas_root, local_root)
    listed = dict((r["repo_id"], r) for r in manifest.get("repos", []))
    for repo in repos:
        if repo["repo_id"] not in listed:
            problems.append("%s is not in the manifest's repos" % repo["repo_id"])
            continue
        problems.extend(_repo_coverage_problems(repo, listed[repo["repo_id"]]["target"], manifest["mounts"],
                                                answer_sources, nas_root))
    return problems


def _mount_list_problems(manifest, answer_sources, nas_root, local_root):
    """The mounts alone: unique targets, counts that match, NAS binds read-only and on the NAS, local
    binds from local regular files."""
    problems = []
    mounts = manifest["mounts"]
    targets = [m["target"] for m in mounts]
    if len(targets) != len(set(targets)):
        problems.append("two mounts share a target")
    counts = manifest["counts"]
    for origin in ("local", "nas"):
        if counts.get(origin) != len([m for m in mounts if m["origin"] == origin]):
            problems.append("counts.%s=%s does not match the mounts" % (origin, counts.get(origin)))
    if counts.get("total") != len(mounts):
        problems.append("counts.total=%s, %d mounts" % (counts.get("total"), len(mounts)))
    nas_real = os.path.realpath(nas_root)
    for m in mounts:
        src = m["source"]
        if m["origin"] == "nas":
            if m["read_only"] is not True:
                problems.append("NAS bind %s -> %s is not read-only" % (src, m["target"]))
            if not src.startswith(nas_real + "/") and not src.startswith(nas_root + "/"):
                problems.append("NAS bind source %s is not on the NAS" % src)
        elif m["origin"] == "local":
            info = answer_sources.get(src, {})
            if info.get("type") != "file" or not info.get("real", "").startswith(local_root + "/"):
                problems.append("local bind source %s is not a regular file on the local disk (%s)" % (src, info))
        else:
            problems.append("mount %s has origin %r" % (m["target"], m["origin"]))
    return problems


def _repo_coverage_problems(repo, snap_target, mounts, answer_sources, nas_root):
    """Each NAS file of the repo's snapshot is reachable through exactly one mount holding its content."""
    problems = []
    commit, files = nas_snapshot(nas_root, repo)
    if not snap_target.endswith("/%s/snapshots/%s" % (repo_folder(repo["repo_id"]), commit)):
        problems.append("%s: manifest target %s is not the NAS commit %s" % (repo["repo_id"], snap_target, commit))
    for rel, nas in sorted(files.items()):
        path = snap_target + "/" + rel
        through = [m for m in mounts if m["target"] == path or path.startswith(m["target"].rstrip("/") + "/")]
        if len(through) != 1:
            problems.append("%s:%s is reachable through %d mounts" % (repo["repo_id"], rel, len(through)))
            continue
        m = through[0]
        inside = os.path.join(m["source"], os.path.relpath(path, m["target"])) if path != m["target"] \
            else m["source"]
        if m["origin"] == "nas":
            if not os.path.isfile(inside) or sha256_file(inside) != nas["sha256"]:
                problems.append("%s:%s: NAS bind %s does not hold its content" % (repo["repo_id"], rel, inside))
        else:
            info = answer_sources.get(inside, {})
            if info.get("sha256") != nas["sha256"]:
                problems.append("%s:%s: local bind %s does not hold its content" % (repo["repo_id"], rel, inside))
    return problems


def check_receipts_gone(answer, parent):
    """No receipt root left; the directory the symlinked root pointed to, and its file, survive."""
    problems = ["receipt root %s/%s is still there" % (parent, name) for name in RECEIPT_ROOTS
                if answer["stat"][os.path.join(parent, name)]["lexists"]]
    keep = answer["stat"][os.path.join(parent, "keep", "display-kv", "worker.json")]
    if not keep["lexists"] or keep.get("type") != "file":
        problems.append("%s/keep/display-kv/worker.json (the old link's target, no receipt root) is gone" % parent)
    return problems


def receipt_stat_paths(parent):
    return [os.path.join(parent, n) for n in RECEIPT_ROOTS] + [os.path.join(parent, "keep", "display-kv", "worker.json")]


def check_nas_read_only(answer, nas_root):
    """The NAS is bound read-only into the node (the harness itself: a writable NAS proves nothing)."""
    nas_parent = os.path.realpath(os.path.dirname(os.path.dirname(nas_root)))
    best = max((m for m in answer["mounts"]
                if nas_parent == m["mount_point"] or nas_parent.startswith(m["mount_point"].rstrip("/") + "/")),
               key=lambda m: len(m["mount_point"]))
    if best["mount_point"] == "/":
        return ["the NAS is not a separate mount in the node"]
    if "ro" not in best["options"]:
        return ["the NAS mount %s is not read-only: %s" % (best["mount_point"], best["options"])]
    return []


def nas_unchanged():
    """Compare the NAS with the fingerprint shared/prepare.yml took before converge."""
    before = os.path.join(ephemeral_dir(), "nas-fingerprint-before.json")
    cmd = [sys.executable, os.path.join(HERE, "nas_hub.py"), "compare", NAS_ROOT, before]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    return [] if proc.returncode == 0 else (proc.stdout.splitlines() or ["compare failed: rc %d" % proc.returncode])

