#!/usr/bin/env python3
"""`make bench`: hf_hub_mirror against the standard tools, on the same data in the same run.

Cases (each alternates the module and its baselines for BENCH_ROUNDS rounds; medians reported):
1. cold_stage   stage a tools/hubgen.py hub (page15 left out) vs `cp -rL` of the same files + `sync`.
2. full_verify  verify=full vs `sha256sum` of every local blob, and vs the machine limit:
                min(cold read rate, the faster of `cat` and `dd iflag=nocache`; cores x hashlib sha256 rate).
3. warm_rerun   re-run on an already staged layout of SPARSE files vs `rsync -aL --checksum`.
4. stage_play   `ansible-playbook stage-deepseek.yml --tags [preflight,]stage` on a warm hub vs the
                module's summed duration_s: Ansible's overhead per host.
5. peak_rss     peak RSS (VmHWM) of the module process staging one BENCH_BIG_GIB GiB blob.
6. capped_stage the case-1 stage with max_mib_s at a quarter of this machine's uncapped rate and io_priority=idle:
                the module's achieved_mib_s within 10 % of the cap.

Module and baselines both run through ad-hoc `ansible localhost -m ...` (json callback) so both pay the
same start: "wall" is that call's time, "own" the module's duration_s or the command's delta. Before each
timed run the page cache is dropped (as root) and the machine settles BENCH_SETTLE_S seconds; "cache GiB"
is how much the page cache grew during a run.

Hubs are cached under .cache/bench/hubs/ keyed by their parameters; .cache/bench/work/ is removed at the
end. Results: a table on stdout, .cache/bench/bench-<UTC time>.json and .cache/bench/latest.json.

Environment: BENCH_ROUNDS (3), BENCH_SLOW_ROUNDS (rsync rounds, 2), BENCH_WORKERS (module `workers`),
BENCH_CASES (comma list, default all), BENCH_SETTLE_S (3), BENCH_SHARDS (8), BENCH_SHARD_MIB (700),
BENCH_WARM_BLOBS (141), BENCH_WARM_GIB (106), BENCH_BIG_GIB (4.5).
"""
import datetime
import functools
import hashlib
import json
import operator
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import hubgen  # noqa: E402  (the synthetic hub generator of the tests and the demo)

MIB = 1 << 20
GIB = 1 << 30
EDGE = 1 * MIB             # data at the head and the tail of every sparse shard
BLOCK = 64 * 1024          # plus one data block ...
STRIDE = 32 * MIB          # ... somewhere in every STRIDE of the middle
_ZEROS = memoryview(bytes(8 * MIB))
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")

ROOT = os.path.join(REPO, ".cache", "bench")
HUBS = os.path.join(ROOT, "hubs")
WORK = os.path.join(ROOT, "work")
BIN = os.path.dirname(sys.executable)

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
SLOW_ROUNDS = min(ROUNDS, int(os.environ.get("BENCH_SLOW_ROUNDS", "2")))
WORKERS = os.environ.get("BENCH_WORKERS") or None
SETTLE_S = float(os.environ.get("BENCH_SETTLE_S", "3"))
SHARDS = int(os.environ.get("BENCH_SHARDS", "8"))
SHARD_MIB = int(os.environ.get("BENCH_SHARD_MIB", "700"))
WARM_BLOBS = int(os.environ.get("BENCH_WARM_BLOBS", "141"))
WARM_GIB = float(os.environ.get("BENCH_WARM_GIB", "106"))
BIG_GIB = float(os.environ.get("BENCH_BIG_GIB", "4.5"))
CASE_NAMES = ("cold_stage", "full_verify", "warm_rerun", "stage_play", "peak_rss", "capped_stage")
# Run order: the stage play and the capped stage re-use case 1's local hub, removed before the big sparse layout.
RUN_ORDER = ("cold_stage", "full_verify", "stage_play", "capped_stage", "warm_rerun", "peak_rss")
CASES = [c.strip() for c in os.environ.get("BENCH_CASES", ",".join(CASE_NAMES)).split(",") if c.strip()]

MAIN_REPO = hubgen.MAIN_REPO
DRAFTER_REPO = hubgen.DRAFTER_REPO
MIRROR = "hf_hub_mirror"


class BenchError(Exception):
    pass


def log(msg):
    sys.stderr.write("bench: %s\n" % msg)
    sys.stderr.flush()


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# Hub layouts, cached under HUBS; sparse shards keep a >= 100 GiB layout well under 1 GB of disk.

def cached_layout(root, key, build):
    """The description of layout `key` under root, built by build(path) -> dict when not complete."""
    path = os.path.join(root, key)
    marker = os.path.join(path, "layout.json")
    if os.path.isfile(marker):
        with open(marker) as handle:
            return json.load(handle)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    desc = build(path)
    desc.update(key=key, path=path)
    with open(marker + ".tmp", "w") as handle:
        json.dump(desc, handle, indent=1, sort_keys=True)
    os.replace(marker + ".tmp", marker)
    return desc


def data_segments(size, rng):
    """Sorted, non-overlapping (offset, length) data ranges of a sparse shard; holes elsewhere."""
    if size <= 2 * EDGE + STRIDE:
        return [(0, size)]
    segments = [(0, EDGE)]
    for start in range(STRIDE, size - EDGE - STRIDE + 1, STRIDE):
        segments.append((start + rng.randrange(0, STRIDE - BLOCK, 4096), BLOCK))
    segments.append((size - EDGE, EDGE))
    return segments


def sparse_shard(label, size):
    """(data segments, sha256 of the logical content) of a shard, deterministic from its label; no disk I/O."""
    rng = random.Random("benchhub:" + label)
    segments = [(offset, rng.randbytes(length)) for offset, length in data_segments(size, rng)]
    h = hashlib.sha256()
    pos = 0
    for offset, data in segments + [(size, b"")]:
        while pos < offset:
            step = min(offset - pos, len(_ZEROS))
            h.update(_ZEROS[:step])      # large updates release the GIL: shards hash in parallel
            pos += step
        h.update(data)
        pos += len(data)
    return segments, h.hexdigest()


def write_sparse(path, segments, size):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for offset, data in segments:
            os.pwrite(fd, data, offset)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


SPARSE_FORMS = (hubgen.FORM_REAL, hubgen.FORM_REL_STORE, hubgen.FORM_ABS_STORE)   # shard i: SPARSE_FORMS[i % 3]


def sparse_hub(root, repo_id, n_shards, shard_size, metadata=True, seed=0):
    """A hubgen NAS hub with one repo of n_shards sparse shards (+ 4 small files and the index when metadata)."""
    key = "sparse-%s-%dx%dMiB%s-seed%d" % (repo_id.replace("/", "--"), n_shards, shard_size // MIB,
                                          "-meta" if metadata else "", seed)

    def build(path):
        repo = hubgen.Repo(hubgen.Hub(os.path.join(path, "hub"), seed), repo_id)
        names = hubgen.shard_names(n_shards)

        def place(i):
            """Hash and write shard i in its NAS form; blob_id is the LFS pointer's, as huggingface_hub lists it."""
            segments, sha = sparse_shard("%d:%s:%s" % (seed, key, names[i]), shard_size)
            form = SPARSE_FORMS[i % 3]
            return names[i], repo.link(repo.snap, names[i], {
                "kind": "link", "etag": sha, "size": shard_size, "sha256": sha,
                "blob_id": hubgen.git_blob_sha1(hubgen.lfs_pointer(sha, shard_size)), "blob_form": form,
                "store_path": repo.place(sha, lambda path: write_sparse(path, segments, shard_size), form),
                "data_bytes": sum(len(d) for _, d in segments)})

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            repo.files.update(pool.map(place, range(n_shards)))
        if metadata:
            rng = random.Random("benchhub-small:%d:%s" % (seed, key))
            for name in SMALL_FILES:
                repo.add(name, json.dumps({"bench": name, "data": rng.randbytes(1500).hex()}).encode())
            for i, name in enumerate(names):
                repo.map(name, [("w.%d" % i, shard_size)])
        repo.finish()
        files = repo.files
        return {"hub": repo.hub.hub, "repo_id": repo_id, "folder": repo.folder, "commit": repo.commit,
                "files": files, "blobs": len(files), "logical_bytes": sum(f["size"] for f in files.values()),
                "data_bytes": sum(f.get("data_bytes", f["size"]) for f in files.values())}

    return cached_layout(root, key, build)


SPARSE_CP = ["cp", "--sparse=always", "--preserve=mode,timestamps"]


def stage_like_module(desc, dest_hub):
    """Lay out `desc` under dest_hub as hf_hub_mirror leaves it staged (sparse copies), so a re-run changes nothing."""
    nas_repo = os.path.join(desc["hub"], desc["folder"])
    repo = os.path.join(dest_hub, desc["folder"])
    snapshot = os.path.join(repo, "snapshots", desc["commit"])
    for sub in ("blobs", "refs", "trees", snapshot):
        os.makedirs(os.path.join(repo, sub), exist_ok=True)
    for name, info in sorted(desc["files"].items()):
        subprocess.check_call(SPARSE_CP + [os.path.realpath(os.path.join(nas_repo, "blobs", info["etag"])),
                                           os.path.join(repo, "blobs", info["etag"])])
        os.symlink("../../blobs/" + info["etag"], os.path.join(snapshot, name))
    with open(os.path.join(repo, "refs", "main"), "w") as handle:
        handle.write(desc["commit"])
    # The module writes the NAS listing restricted to the staged paths (here: all), indent 2, sorted keys.
    with open(os.path.join(nas_repo, "trees", desc["commit"] + ".json")) as handle:
        listing = json.load(handle)
    with open(os.path.join(repo, "trees", desc["commit"] + ".json"), "wb") as handle:
        handle.write(json.dumps(listing, indent=2, sort_keys=True).encode("utf-8") + b"\n")
    return snapshot


def file_states(top):
    """{relative path: (inode, size, mtime, ctime, link text)} below top: any write or relink changes a state."""
    states = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            states[os.path.relpath(path, top)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                  os.readlink(path) if os.path.islink(path) else None)
    return states


# Measuring: cold cache, processes, ad-hoc ansible, peak RSS, disk use.

def cold():
    """Sync, drop the page cache and let the machine settle; False when the cache cannot be dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError:
        return False
    time.sleep(SETTLE_S)
    return True


class ProcWatch(threading.Thread):
    """Peak VmHWM, peak summed VmRSS and rchar/wchar of the python descendants whose argv holds `needle`."""

    def __init__(self, proc, needle):
        threading.Thread.__init__(self, daemon=True)
        self.proc, self.needle = proc, needle.encode()
        self.hwm = self.tree = 0
        self.io = {}           # pid -> (rchar, wchar)

    def poll_once(self):
        kids = {}              # ppid -> [pid]
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/stat" % pid, "rb") as handle:
                    kids.setdefault(handle.read().rsplit(b")", 1)[1].split()[1].decode(), []).append(pid)
            except (OSError, IndexError):
                continue        # gone meanwhile
        todo, rss = [str(self.proc.pid)], 0
        while todo:
            pid = todo.pop()
            todo.extend(kids.get(pid, []))
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as handle:
                    argv = handle.read().split(b"\0")
                if not (os.path.basename(argv[0]).startswith(b"python") and any(self.needle in a for a in argv)):
                    continue    # not the module's interpreter (the shells ansible starts it through, say)
                fields = {}
                for name in ("status", "io"):
                    with open("/proc/%s/%s" % (pid, name)) as handle:
                        fields.update((k, (v.split() or ["0"])[0]) for k, _, v in (ln.partition(":") for ln in handle))
                hwm, vmrss = int(fields.get("VmHWM", 0)) * 1024, int(fields.get("VmRSS", 0)) * 1024
                self.io[pid] = (int(fields.get("rchar", 0)), int(fields.get("wchar", 0)))
            except (OSError, ValueError):
                continue
            self.hwm = max(self.hwm, hwm)
            rss += vmrss
        self.tree = max(self.tree, rss)

    def run(self):
        while self.proc.poll() is None:
            self.poll_once()
            time.sleep(0.02)

    def record(self):
        return {"rss_hwm_bytes": self.hwm, "rss_sum_bytes": self.tree, "module_pids": len(self.io),
                "read_bytes": sum(r for r, _ in self.io.values()), "written_bytes": sum(w for _, w in self.io.values())}


def run_process(argv, env=None, capture=True, watch=None):
    """Run argv to its end in its own session: (wall seconds, stdout, returncode, ProcWatch or None)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE if capture else subprocess.DEVNULL, stderr=subprocess.PIPE)
    watcher = ProcWatch(proc, watch) if watch else None
    if watcher:
        watcher.start()
    out, err = proc.communicate()
    wall = time.monotonic() - start
    if watcher:
        watcher.join()
    if proc.returncode != 0 and not capture:
        raise BenchError("%s failed (rc %d): %s" % (argv[0], proc.returncode, err.decode("utf-8", "replace")[-600:]))
    return wall, out, proc.returncode, watcher


def ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0",
                ANSIBLE_LOCAL_TEMP=os.path.join(WORK, "ansible", "local-tmp"),
                ANSIBLE_REMOTE_TMP=os.path.join(WORK, "ansible", "remote-tmp"),
                PATH=BIN + os.pathsep + os.environ.get("PATH", ""))


RESULT_KEYS = ("changed", "blobs", "bytes_copied", "duration_s", "files", "rc", "delta", "bytes_read", "read_s",
               "max_mib_s", "achieved_mib_s", "io_priority")


def ansible(module, args, check=False, watch=False):
    """One ad-hoc `ansible localhost -m module` call: wall time, own time (duration_s or delta) and result."""
    argv = [os.path.join(BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", module, "-a", json.dumps(args)]
    if check:
        argv.append("--check")
    wall, out, rc, watcher = run_process(argv, env=ansible_env(), watch="AnsiballZ_%s" % module.split(".")[-1]
                                         if watch else None)
    try:
        result = json.loads(out)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        raise BenchError("ansible -m %s: rc %d, output is not the json callback's:\n%s"
                         % (module, rc, out.decode("utf-8", "replace")[-1500:]))
    if rc != 0 or result.get("failed"):
        raise BenchError("ansible -m %s failed (rc %d): %s" % (module, rc, result.get("msg") or result.get("stderr")))
    run = {"wall_s": round(wall, 3),
           "own_s": result["duration_s"] if "duration_s" in result else round(sum(float(part) * 60 ** i for i, part in enumerate(result["delta"].split(":")[::-1])), 3),
           "result": dict((k, result[k]) for k in RESULT_KEYS if k in result)}
    if watcher:
        run.update(watcher.record())
    return run


def mirror(args, copies, what, **kwargs):
    """One hf_hub_mirror call that must copy exactly `copies` bytes (and, copying none, change nothing)."""
    record = ansible(MIRROR, args, **kwargs)
    result = record["result"]
    if result["bytes_copied"] != copies or (not copies and result["changed"]):
        raise BenchError("%s: hf_hub_mirror copied %s bytes, expected %d: %s" % (what, result["bytes_copied"], copies,
                                                                              result))
    return record


def mirror_args(src, dest, repo_id, **extra):
    args = dict(src=src, dest=dest, repo_id=repo_id, **extra)
    if WORKERS:
        args["workers"] = int(WORKERS)
    return args


def cold_run(call, prepare=None, cleanup=None):
    """A timed-run function: prepare, drop the cache, call() -> run record (marked cold or not), clean up."""
    def run():
        if prepare:
            prepare()
        is_cold = cold()
        cached = meminfo_bytes("Cached")
        record = call()
        record.update(cold=is_cold, page_cache_grew_gib=round((meminfo_bytes("Cached") - cached) / GIB, 2))
        disk_sample()
        if cleanup:
            cleanup()
        return record
    return run


def alternate(label, contenders):
    """{name: [run records]} of contenders [(name, rounds, run)], order reversed every other round."""
    runs = dict((name, []) for name, _, _ in contenders)
    for r in range(max(rounds for _, rounds, _ in contenders)):
        for name, rounds, run in (contenders if r % 2 == 0 else contenders[::-1]):
            if r < rounds:
                record = run()
                record["round"] = r + 1
                runs[name].append(record)
                log("%s round %d: %-34s wall %7.2f s  own %7.2f s" % (label, r + 1, name, record["wall_s"],
                                                                     record["own_s"]))
    return runs


def row(name, records, nbytes=None):
    """A table row: medians over the run records; MiB/s over the contender's own time."""
    own = median([r["own_s"] for r in records])
    return {"contender": name, "runs": len(records), "wall_s": median([r["wall_s"] for r in records]),
            "own_s": own, "mib_s": (nbytes / MIB / own) if nbytes and own else None,
            "cache_gib": median([r.get("page_cache_grew_gib") for r in records]),
            "cold": all(r.get("cold") for r in records), "records": records}


DISK = {"peak": 0, "min_free": float("inf")}   # bytes allocated under .cache/bench, free space left


def disk_sample():
    du = subprocess.run(["du", "-s", "-B1", ROOT], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    DISK["peak"] = max(DISK["peak"], int(du.stdout.split()[0]))   # allocated: sparse files count data only
    DISK["min_free"] = min(DISK["min_free"], shutil.disk_usage(ROOT).free)


UNIT_FORMAT = {"x": "%.2fx", "%": "%.0f %%", "s": "%.2f s", "MB": "%.1f MB"}
DELTA_FORMAT = dict(UNIT_FORMAT, **{"%": "%.0f points"})


def target(name, value, op, goal, unit):
    """Measured value against its target: met, or missed by how much."""
    met = value is not None and {"<=": operator.le, "<": operator.lt, ">=": operator.ge}[op](value, goal)
    verdict = "not measured" if value is None else "met" if met else "MISSED by %s (%.0f %% %s)" % (
        DELTA_FORMAT[unit] % abs(value - goal), 100.0 * abs(value / goal - 1), "over" if op in ("<", "<=") else "short")
    return {"name": name, "value": None if value is None else round(value, 4), "op": op, "target": goal, "unit": unit,
            "met": met, "verdict": verdict}


def ratio(a, b):
    return a / b if a is not None and b else None


# Cases.

STAGED = os.path.join(WORK, "stage-local")   # the case-1 local hub, staged by the module


@functools.lru_cache(maxsize=None)
def trap_hub():
    """The hubgen hub of the first cases (built on first use)."""
    started = time.monotonic()
    desc = cached_layout(HUBS, "hubgen-%dx%dMiB-seed0" % (SHARDS, SHARD_MIB), lambda path:
                         hubgen.build_nas_hub(path, shard_size=SHARD_MIB * MIB, n_shards=SHARDS))
    log("hubgen hub %s ready in %.1f s" % (desc["key"], time.monotonic() - started))
    return desc


def main_args(**extra):
    return mirror_args(trap_hub()["hub"], STAGED, MAIN_REPO, ignore_patterns=["page15/"], **extra)


def ensure_staged():
    """The case-1 hub staged locally (staged here, untimed, when case 1 did not run)."""
    if not os.path.isdir(os.path.join(STAGED, trap_hub()["repos"][MAIN_REPO]["folder"])):
        fresh(STAGED)
        ansible(MIRROR, main_args())
    return STAGED


def case_cold_stage():
    """Cold stage, default verify, vs cp -rL of the same selected files + sync."""
    main = trap_hub()["repos"][MAIN_REPO]
    snapshot = os.path.join(trap_hub()["hub"], main["folder"], "snapshots", main["commit"])
    selected = sorted(p for p in main["files"] if p not in main["page15"])
    nbytes = sum(main["files"][p]["size"] for p in selected)
    tops = sorted(set(os.path.join(snapshot, p.split("/")[0]) for p in selected))
    cp_dest = os.path.join(WORK, "cp-dest")
    cp_cmd = "cp -rL -- %s %s/ && sync" % (" ".join(shlex.quote(t) for t in tops), shlex.quote(cp_dest))

    def copy():
        record = ansible("ansible.builtin.shell", {"cmd": cp_cmd})
        record["bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cp_dest) for f in fs)
        if record["bytes"] != nbytes:
            raise BenchError("cp -rL copied %d bytes, the selection is %d" % (record["bytes"], nbytes))
        return record

    runs = alternate("cold_stage", [
        ("hf_hub_mirror verify=sample", ROUNDS, cold_run(lambda: mirror(main_args(), nbytes, "the selection"),
                                                        prepare=lambda: fresh(STAGED))),
        ("cp -rL + sync", ROUNDS, cold_run(copy, prepare=lambda: fresh(cp_dest),
                                           cleanup=lambda: shutil.rmtree(cp_dest))),
    ])
    rows = [row(name, records, nbytes) for name, records in runs.items()]
    wall_ratio = ratio(rows[0]["wall_s"], rows[1]["wall_s"])
    own_ratio = ratio(rows[0]["own_s"], rows[1]["own_s"])
    return {
        "title": "cold stage: %d x %d MiB hubgen hub, page15 excluded, %.2f GiB in %d files, default verify"
                 % (SHARDS, SHARD_MIB, nbytes / GIB, len(selected)),
        "bytes": nbytes, "rows": rows,
        "ratios": {"module/cp wall": wall_ratio, "module/cp own": own_ratio},
        "targets": [target("cold stage / (cp -rL && sync), wall of the ansible calls", wall_ratio, "<=", 1.05, "x")],
        "notes": ["both write the same %d selected files (%d bytes); the module fsyncs each blob, the baseline "
                  "runs sync" % (len(selected), nbytes),
                  "cache GiB: page cache a run leaves filled (cp keeps what it read and wrote; a tool that drops its "
                  "pages behind it re-uses them); on a VM with a slow fill rate (machine lines) that costs time"],
    }


def hashlib_rate(seconds=1.0):
    """One core's hashlib sha256 rate (bytes/s) on an in-memory buffer."""
    buf = memoryview(os.urandom(64 * MIB))
    h = hashlib.sha256()
    done, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        h.update(buf)
        done += len(buf)
    return done / (time.monotonic() - start)


def case_full_verify():
    """verify=full over the staged hub vs sha256sum of every local blob, vs the machine limit."""
    blob_dir = os.path.join(ensure_staged(), trap_hub()["repos"][MAIN_REPO]["folder"], "blobs")
    blobs = sorted(os.path.join(blob_dir, b) for b in os.listdir(blob_dir))
    nbytes = sum(os.path.getsize(b) for b in blobs)

    def read(argv):
        """A plain read of every blob, timed as one process (no Ansible start: this is the limit)."""
        wall, _, _, _ = run_process(argv, capture=False)
        return {"wall_s": round(wall, 3), "own_s": round(wall, 3)}

    # dd iflag=nocache drops the pages behind its reads: the same bytes read without keeping them cached,
    # which a VM that charges for every newly cached page (machine lines) rewards; the limit takes the faster.
    drop_behind = 'for f in "$@"; do dd if="$f" of=/dev/null bs=8M iflag=nocache status=none || exit 1; done'
    cores = os.cpu_count() or 1
    hash_rate = hashlib_rate()
    runs = alternate("full_verify", [
        ("hf_hub_mirror verify=full", ROUNDS, cold_run(lambda: mirror(main_args(verify="full"), 0,
                                                                        "verify=full over a good staged hub"))),
        ("sha256sum (all blobs)", ROUNDS, cold_run(lambda: ansible("ansible.builtin.command",
                                                                   {"argv": ["sha256sum"] + blobs}))),
        ("cat > /dev/null (read limit)", ROUNDS, cold_run(lambda: read(["cat"] + blobs))),
        ("dd iflag=nocache (read limit)", ROUNDS, cold_run(lambda: read(["sh", "-c", drop_behind, "dd"] + blobs))),
    ])
    rows = [row(name, records, nbytes) for name, records in runs.items()]
    cat_rate, dd_rate = nbytes / rows[2]["own_s"], nbytes / rows[3]["own_s"]
    limit = min(max(cat_rate, dd_rate), cores * hash_rate)
    fraction = nbytes / rows[0]["own_s"] / limit
    cat_fraction = nbytes / rows[0]["own_s"] / min(cat_rate, cores * hash_rate)
    return {
        "title": "full offline verify: %d local blobs, %.2f GiB, cold cache" % (len(blobs), nbytes / GIB),
        "bytes": nbytes, "rows": rows,
        "limit": {"cat_mib_s": cat_rate / MIB, "dd_nocache_mib_s": dd_rate / MIB, "cores": cores,
                  "hashlib_sha256_mib_s_per_core": hash_rate / MIB, "limit_mib_s": limit / MIB,
                  "bound_by": "read" if max(cat_rate, dd_rate) <= cores * hash_rate else "hash"},
        "ratios": {"module fraction of limit": fraction, "module fraction of cat-only limit": cat_fraction,
                   "sha256sum fraction of limit": nbytes / rows[1]["own_s"] / limit,
                   "module/sha256sum own": ratio(rows[0]["own_s"], rows[1]["own_s"])},
        "targets": [target("full verify, fraction of the machine limit (own time)", 100.0 * fraction, ">=", 80.0, "%")],
        "notes": ["machine limit = min(cold read: the faster of cat %.0f and dd iflag=nocache %.0f MiB/s, %d cores x "
                  "hashlib sha256 %.0f MiB/s) = %.0f MiB/s; with cat alone as the read rate (the target's definition) "
                  "the module is at %.0f %%"
                  % (cat_rate / MIB, dd_rate / MIB, cores, hash_rate / MIB, limit / MIB, 100 * cat_fraction)],
    }


def case_stage_play():
    """The stage play through ansible-playbook on a warm staged hub vs the module's own time."""
    play_dir = fresh(os.path.join(WORK, "play"))
    inventory = os.path.join(play_dir, "inventory.json")
    group_vars = {"lane": "exl3_2x", "hub_nas_root": trap_hub()["hub"], "hub_local_root": ensure_staged(),
                  "stage_repos": [{"repo_id": MAIN_REPO, "ignore_patterns": ["page15/"]}, {"repo_id": DRAFTER_REPO}],
                  "stage_report_dir": os.path.join(play_dir, "reports"), "engine_enabled": False}
    hosts = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    with open(inventory, "w") as handle:
        json.dump({"all": {"children": {"exl3_2x": {"hosts": hosts}}, "vars": group_vars}}, handle)
    def play(tags):
        argv = [os.path.join(BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "stage-deepseek.yml"),
                "--tags", tags]
        wall, out, rc, _ = run_process(argv, env=ansible_env())
        try:
            data = json.loads(out)
        except ValueError:
            raise BenchError("ansible-playbook rc %d, output is not JSON: %s" % (rc, out[-1500:]))
        if rc != 0:
            raise BenchError("ansible-playbook rc %d: %s" % (rc, data.get("stats")))
        calls = [item for p in data["plays"] for task in p["tasks"] for res in task["hosts"].values()
                 for item in res.get("results", [res]) if isinstance(item, dict) and "blobs" in item
                 and "duration_s" in item]
        own = sum(item["duration_s"] for item in calls)
        disk_sample()
        return {"wall_s": round(wall, 3), "own_s": round(own, 3), "module_calls": len(calls),
                "overhead_s": round(wall - own, 3), "changed_tasks": data["stats"]["localhost"].get("changed")}

    # The stage play alone is the case; with the preflight play in front is what a full run does.
    plays = [("ansible-playbook --tags %s" % tags, ROUNDS, lambda tags=tags: play(tags))
             for tags in ("stage", "preflight,stage")]
    play("preflight,stage")   # warm-up: stages the drafter, fills the caches; not counted
    runs = alternate("stage_play", plays)
    rows = [row(name, records) for name, records in runs.items()]
    overheads = dict((name, median([r["overhead_s"] for r in records])) for name, records in runs.items())
    calls = dict((name, records[0]["module_calls"]) for name, records in runs.items())
    return {
        "title": "stage play: 1 host, 2 repos already staged, warm page cache",
        "rows": rows, "ratios": {"overhead per host s (%s)" % name: value for name, value in overheads.items()},
        "targets": [target("stage play, Ansible overhead per host (play wall - module time)",
                           overheads["ansible-playbook --tags stage"], "<", 3.0, "s")],
        "notes": ["own = the module's duration_s summed over its calls (%s); the overhead includes starting "
                  "ansible-playbook and the lane-selection play; page cache left warm on purpose (this measures "
                  "Ansible's own work, not disk reads)"
                  % ", ".join("%s: %d" % (name, n) for name, n in calls.items())],
    }


def case_capped_stage():
    """Cold stages capped at a quarter of one uncapped cold stage's read rate, in the idle I/O class."""
    main = trap_hub()["repos"][MAIN_REPO]
    nbytes = sum(f["size"] for p, f in main["files"].items() if p not in main["page15"])

    def stage(**extra):
        return cold_run(lambda: mirror(main_args(**extra), nbytes, "the selection"), prepare=lambda: fresh(STAGED))

    def read_mib(record):
        return sum(record["result"]["bytes_read"].values()) / MIB

    probe = alternate("capped_stage", [("hf_hub_mirror uncapped (probe)", 1, stage())])
    first = probe["hf_hub_mirror uncapped (probe)"][0]
    rate = first["result"]["achieved_mib_s"] or ratio(read_mib(first), first["result"]["read_s"])
    if not rate:
        raise BenchError("the uncapped stage read nothing in a measurable time: %s" % first["result"])
    cap = max(1, int(round(rate / 4)))
    name = "hf_hub_mirror max_mib_s=%d io_priority=idle" % cap
    runs = alternate("capped_stage", [(name, ROUNDS, stage(max_mib_s=cap, io_priority="idle"))])
    records = runs[name]
    achieved = median([r["result"]["achieved_mib_s"] for r in records])
    overall = median([read_mib(r) / r["own_s"] for r in records])
    read_s = median([r["result"]["read_s"] for r in records])
    io = records[0]["result"]["io_priority"]
    return {
        "title": "capped stage: case 1's selection (%.2f GiB), cold cache, cap = a quarter of the uncapped rate"
                 % (nbytes / GIB),
        "bytes": nbytes, "rows": [row(n, rs, nbytes) for n, rs in list(probe.items()) + list(runs.items())],
        "ratios": {"uncapped MiB/s": rate, "cap MiB/s": cap, "achieved_mib_s": achieved,
                   "bytes read / duration_s MiB/s": overall, "capped read_s": read_s},
        "targets": [target("capped stage, |achieved_mib_s - cap| / cap", None if achieved is None else
                           100.0 * abs(achieved - cap) / cap, "<=", 10.0, "%")],
        "notes": ["uncapped rate = the probe's %s; the capped runs' achieved_mib_s is the module's own figure, "
                  "bytes read / duration_s the bench's (it also counts the time before the first read and after the "
                  "last: planning, fsync, links)" % ("achieved_mib_s" if first["result"]["achieved_mib_s"] else
                                                     "bytes read / read_s (under 1 s of reading: no achieved_mib_s)"),
                  "I/O class applied: %s, scheduler %s%s" % (io.get("applied"), io.get("scheduler"),
                                                              "; " + io["note"] if io.get("note") else "")]
                 + (["the capped reads lasted %.1f s, near the cap's 5 s window: raise BENCH_SHARDS or "
                     "BENCH_SHARD_MIB for a meaningful target" % read_s] if read_s < 10 else []),
    }


def case_warm_rerun():
    """Warm re-run on a >= 100 GiB sparse layout vs rsync -aL --checksum, both through ad-hoc ansible."""
    shard_size = -(-int(WARM_GIB * GIB) // (WARM_BLOBS - 5) // MIB) * MIB
    started = time.monotonic()
    nas = sparse_hub(HUBS, "bench/warm-layout", WARM_BLOBS - 5, shard_size)
    log("sparse hub %s ready in %.1f s" % (nas["key"], time.monotonic() - started))
    snapshot = os.path.join(nas["hub"], nas["folder"], "snapshots", nas["commit"])
    local = fresh(os.path.join(WORK, "warm-local"))
    stage_like_module(nas, local)
    rsync_dest = fresh(os.path.join(WORK, "warm-rsync"))
    subprocess.check_call(SPARSE_CP + ["-rL", snapshot + "/.", rsync_dest])   # links followed, sparse
    args = mirror_args(nas["hub"], local, nas["repo_id"])
    mirror(args, 0, "check mode on the pre-staged sparse layout (not what the module leaves; not run for real on "
           "%d GiB)" % (nas["logical_bytes"] // GIB), check=True)   # proves the layout without writing
    repo = os.path.join(local, nas["folder"])
    before = file_states(repo)
    cold()
    reads = ansible(MIRROR, args, watch=True)["read_bytes"]   # untimed: what one warm run reads

    rsync = ("rsync -aL --checksum", SLOW_ROUNDS, cold_run(lambda: ansible("ansible.builtin.command", {
        "argv": ["rsync", "-aL", "--checksum", snapshot + "/", rsync_dest + "/"]})))
    rerun = cold_run(lambda: mirror(args, 0, "a warm re-run"))
    runs = alternate("warm_rerun", [("hf_hub_mirror verify=sample", ROUNDS, rerun)]
                     + ([rsync] if shutil.which("rsync") else []))
    touched = sorted(p for p, state in file_states(repo).items() if before.get(p) != state)
    if touched or len(before) != len(file_states(repo)):
        raise BenchError("the warm re-runs changed the staged layout: %s" % (touched[:5] or "entries added/removed"))
    rows = [row(name, records, nas["logical_bytes"]) for name, records in runs.items()]
    speedup = ratio(rows[1]["own_s"], rows[0]["own_s"]) if len(rows) > 1 else None
    shutil.rmtree(local)
    shutil.rmtree(rsync_dest)
    return {
        "title": "warm re-run: %d blobs, %.1f GiB of SPARSE files (NAS and local copy both sparse, %.1f MiB of "
                 "data per copy), default verify" % (nas["blobs"], nas["logical_bytes"] / GIB, nas["data_bytes"] / MIB),
        "bytes": nas["logical_bytes"], "sparse": True, "rows": rows,
        "ratios": {"rsync/module own": speedup,
                   "rsync/module wall": ratio(rows[1]["wall_s"], rows[0]["wall_s"]) if len(rows) > 1 else None},
        "targets": [target("warm re-run, module duration_s", rows[0]["own_s"], "<", 0.5, "s"),
                    target("warm re-run, rsync --checksum / module (own times)", speedup, ">=", 100.0, "x")],
        "notes": ["SPARSE: holes read as zeros with no disk I/O, for the module and rsync alike; MiB/s counts "
                  "logical bytes",
                  "the local copy was laid out by the bench (sparse copies), never written by the module: a check-"
                  "mode run and every timed run reported changed=false and 0 bytes copied",
                  "one warm run (untimed, watched) read %.1f MiB: %.0f KiB per blob per side (rchar of the module "
                  "process, page-cache hits included)" % (reads / MIB, reads / 1024.0 / 2 / nas["blobs"]),
                  "rsync runs %d round(s): it reads all %.0f GiB on both sides" % (SLOW_ROUNDS, nas["logical_bytes"] / GIB)]
                 + ([] if shutil.which("rsync") else ["rsync is not installed: no baseline"]),
    }


def case_peak_rss():
    """Peak RSS of the module process staging one blob larger than 4 GiB, and with 8 workers busy at once."""
    size = int(BIG_GIB * GIB)
    one = sparse_hub(HUBS, "bench/one-big-blob", 1, size // MIB * MIB, metadata=False)
    eight = sparse_hub(HUBS, "bench/eight-blobs", 8, size // 8 // MIB * MIB, metadata=False)
    local = os.path.join(WORK, "big-local")

    def stage(nas, **extra):
        return cold_run(lambda: mirror(mirror_args(nas["hub"], local, nas["repo_id"], **extra), nas["logical_bytes"],
                                       "staging %s" % nas["key"], watch=True),
                        prepare=lambda: fresh(local), cleanup=lambda: shutil.rmtree(local))

    runs = alternate("peak_rss", [("hf_hub_mirror staging 1 blob", 1, stage(one)),
                                  ("hf_hub_mirror staging 8 blobs, workers=8", 1, stage(eight, workers=8))])
    peaks = dict((name, max(records[0]["rss_hwm_bytes"], records[0]["rss_sum_bytes"]))
                 for name, records in runs.items())
    rows = [dict(row(name, records, one["logical_bytes"]), peak_rss_mib=peaks[name] / MIB)
            for name, records in runs.items()]
    return {
        "title": "peak RSS: one %.2f GiB blob, then 8 blobs of %.2f GiB with 8 workers (sparse NAS sources, dense "
                 "local writes), cold cache" % (one["logical_bytes"] / GIB, eight["logical_bytes"] / 8 / GIB),
        "bytes": one["logical_bytes"], "rows": rows,
        "ratios": dict(("peak RSS MiB (%s)" % name, peak / MIB) for name, peak in peaks.items()),
        "targets": [target("peak RSS of the module process, %.1f GiB blob" % (one["logical_bytes"] / GIB),
                           peaks["hf_hub_mirror staging 1 blob"] / 1e6, "<", 100.0, "MB"),
                    target("peak RSS of the module process, 8 workers", peaks[
                        "hf_hub_mirror staging 8 blobs, workers=8"] / 1e6, "<", 100.0, "MB")],
        "notes": ["VmHWM of the AnsiballZ_hf_hub_mirror python process (the module runs inside it), polled from "
                  "/proc every 20 ms while it runs (%s); the local copies are removed after the case"
                  % "; ".join("%s: %.1f MiB, %d process(es), read %.2f GiB, wrote %.2f GiB"
                              % (name, records[0]["rss_hwm_bytes"] / MIB, records[0]["module_pids"],
                                 records[0]["read_bytes"] / GIB, records[0]["written_bytes"] / GIB)
                              for name, records in runs.items())],
    }


CASE_FUNCS = {name: globals()["case_" + name] for name in CASE_NAMES}


# Machine description, table, JSON.

def _first(path, prefix):
    with open(path) as handle:
        return next((line.split(":", 1)[1].strip() for line in handle if line.startswith(prefix)), None)


def meminfo_bytes(key):
    return int(_first("/proc/meminfo", key + ":").split()[0]) * 1024


def page_cache_fill_rates():
    """GiB/s filling the page cache from a 1 GiB hole after cold(), then with recycled pages (shows VM host faults)."""
    path = os.path.join(WORK, "page-cache-probe")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    buf = bytearray(8 * MIB)
    rates = []
    try:
        os.ftruncate(fd, GIB)
        if not cold():
            return None, None
        for _ in range(2):
            os.lseek(fd, 0, os.SEEK_SET)
            start = time.monotonic()
            while os.readv(fd, [buf]):
                pass
            rates.append(1.0 / (time.monotonic() - start))
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
        os.unlink(path)
    return rates


def describe_machine():
    df = subprocess.check_output(["df", "--output=target,source,fstype", ROOT]).decode()
    mnt, dev, fstype = df.split("\n")[1].split()
    usage = shutil.disk_usage(ROOT)
    can_drop = os.access("/proc/sys/vm/drop_caches", os.W_OK)
    first, again = page_cache_fill_rates() if can_drop else (None, None)
    from ansible.release import __version__ as ansible_version   # the bench drives this venv's ansible
    return {
        "cores": os.cpu_count(), "cpu": _first("/proc/cpuinfo", "model name"),
        "ram_gib": round(meminfo_bytes("MemTotal") / GIB, 1),
        "kernel": platform.release(), "python": platform.python_version(), "ansible_core": ansible_version,
        "virtualized": "hypervisor" in (_first("/proc/cpuinfo", "flags") or "").split(),
        "disk": {"mount": mnt, "device": dev, "fstype": fstype, "size_gib": round(usage.total / GIB, 1),
                 "free_gib": round(usage.free / GIB, 1)},
        "cold_cache": can_drop, "settle_s": SETTLE_S if can_drop else None,
        "page_cache_fill_gib_s": {"after_drop": round(first, 2), "recycled": round(again, 2)} if first else None,
    }


def code_version():
    def git(*args):
        try:
            return subprocess.check_output(["git", "-C", REPO] + list(args), stderr=subprocess.DEVNULL).decode().strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "engine_dirty": bool(git("status", "--porcelain", "--", "library", "module_utils"))}


def _num(value, fmt):
    return "-" if value is None else fmt % value


def render(report):
    m = report["machine"]
    lines = [
        "dgx-stage bench, %s, code %s%s, workers=%s, %d round(s) (rsync --checksum: %d), medians"
        % (report["started"], report["code"]["commit"], " + uncommitted engine changes" if report["code"]["engine_dirty"]
           else "", WORKERS or "module default", ROUNDS, SLOW_ROUNDS),
        "machine: %d cores (%s%s), %.1f GiB RAM, kernel %s, %s on %s (%.0f GiB, %.0f GiB free at start)"
        % (m["cores"], m["cpu"], ", VM" if m["virtualized"] else "", m["ram_gib"], m["kernel"], m["disk"]["fstype"],
           m["disk"]["device"], m["disk"]["size_gib"], m["disk"]["free_gib"]),
        "cold cache: %s" % ("yes: sync + drop_caches + %.0f s settle before each timed run" % m["settle_s"]
                            if m["cold_cache"] else "NO (not root: cannot drop the page cache; runs are warm)"),
    ]
    fill = m["page_cache_fill_gib_s"]
    if fill:
        lines.append("page cache fill after a drop: %.2f GiB/s, with recycled pages: %.1f GiB/s%s"
                     % (fill["after_drop"], fill["recycled"],
                        " (this VM hands freed RAM back to its host: every GiB a run newly caches after a drop "
                        "costs it ~%.1f s, whichever tool)" % (1 / fill["after_drop"])
                        if fill["after_drop"] * 3 < fill["recycled"] else ""))
    lines += ["", "%-46s %5s %9s %9s %9s %9s" % ("case / contender", "runs", "wall s", "own s", "MiB/s", "cache GiB")]
    for number, name in enumerate(CASE_NAMES, 1):
        case = report["cases"].get(name)
        if case is None:
            continue
        if "error" in case:
            lines.append("%d %s: ERROR %s" % (number, name, case["error"]))
            continue
        lines.append("%d %s" % (number, case["title"]))
        for r in case["rows"]:
            lines.append("  %-44s %5d %9s %9s %9s %9s" % (r["contender"], r["runs"], _num(r["wall_s"], "%.2f"),
                                                          _num(r["own_s"], "%.3f"), _num(r["mib_s"], "%.0f"),
                                                          _num(r["cache_gib"], "%.1f")))
        lines.append("  ratios: " + ", ".join("%s %s" % (k, _num(v, "%.3g")) for k, v in case["ratios"].items()))
        lines.extend("  note: " + note for note in case["notes"])
    lines += ["", "%-66s %10s %10s  %s" % ("target", "measured", "target", "verdict")]
    for t in report["targets"]:
        fmt = UNIT_FORMAT[t["unit"]]
        lines.append("%-66s %10s %10s  %s" % (t["name"], _num(t["value"], fmt), "%s %s" % (t["op"], fmt % t["target"]),
                                              t["verdict"]))
    lines += ["", "bench wall time %.0f s; disk used under .cache/bench at peak %.1f GiB (lowest free %.1f GiB)"
              % (report["wall_s"], report["disk"]["peak_gib"], report["disk"]["min_free_gib"])]
    return "\n".join(lines)


def main():
    unknown = [c for c in CASES if c not in CASE_FUNCS]
    if unknown:
        raise SystemExit("bench: unknown case(s) %s; known: %s" % (", ".join(unknown), ", ".join(CASE_NAMES)))
    started = time.monotonic()
    stamp = datetime.datetime.now(datetime.timezone.utc)
    os.makedirs(HUBS, exist_ok=True)
    fresh(WORK)     # leftovers of an interrupted run are not reusable
    report = {"started": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "code": code_version(),
              "config": {"rounds": ROUNDS, "slow_rounds": SLOW_ROUNDS, "workers": WORKERS, "settle_s": SETTLE_S,
                         "shards": SHARDS, "shard_mib": SHARD_MIB, "warm_blobs": WARM_BLOBS, "warm_gib": WARM_GIB,
                         "big_gib": BIG_GIB, "cases": CASES},
              "machine": describe_machine(), "cases": {}, "targets": []}
    log("machine: %s" % json.dumps(report["machine"]))
    failed = False
    try:
        for name in RUN_ORDER:
            if name not in CASES:
                continue
            if name == "warm_rerun":
                shutil.rmtree(STAGED, ignore_errors=True)   # the cases that use it are done
            case_started = time.monotonic()
            try:
                case = CASE_FUNCS[name]()
            except BenchError as exc:
                log("%s failed: %s" % (name, exc))
                case, failed = {"error": str(exc)}, True
            case["wall_s"] = round(time.monotonic() - case_started, 1)
            log("%s done in %.0f s" % (name, case["wall_s"]))
            report["cases"][name] = case
    finally:
        disk_sample()
        shutil.rmtree(WORK, ignore_errors=True)
    report["targets"] = [t for name in CASE_NAMES for t in report["cases"].get(name, {}).get("targets", [])]
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    report["disk"] = {"peak_gib": round(DISK["peak"] / GIB, 2), "min_free_gib": round(DISK["min_free"] / GIB, 2)}
    text = render(report)
    print(text)
    report["table"] = text
    out = os.path.join(ROOT, "bench-%s.json" % stamp.strftime("%Y%m%dT%H%M%SZ"))
    with open(out, "w") as handle:
        json.dump(report, handle, indent=1, sort_keys=True)
    shutil.copyfile(out, os.path.join(ROOT, "latest.json"))
    print("results: %s (and latest.json)" % os.path.relpath(out, REPO))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
