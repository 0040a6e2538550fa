"""What a test run left behind: processes, mounts, containers, a Docker daemon, module payloads in the temp dir.

`make test` exports DGX_STAGE_TEST_RUN (a random id) to every step, so each process the tests start carries it in
its environment however it was started: in a new session, daemonized, reparented to init. Mounts and containers
carry no such mark: they are compared with a snapshot taken before the first step, and so are the module payload
directories in the system temp dir (an Ansible module's code, extracted for its run and removed at its end unless
the process was killed: a test that kills one gives it a temp dir of its own).

    python3 tests/leftovers.py snapshot FILE   at the start: the mounts (/proc/self/mountinfo) and the Podman and
                                               Docker containers there now (`ps -a` of each engine that answers)
    python3 tests/leftovers.py check FILE      at the end: every process carrying the run's id (but this one and
                                               its ancestors), every mount, container and payload directory not
                                               in FILE

`check` prints each leftover (a process's pid, parent, session and command line; a mount's point and source; a
container's engine, id and name) and exits 1; 0 with one line when there is none; 2 when it cannot check.
A process still ending gets LEFTOVERS_GRACE seconds (5) to go before it counts.

Mounts, containers and payload directories are the machine's (payloads: this user's): a second test run, or a
`make demo`, on the same machine at the same time shows up in them too. Stdlib only, as everything that may run on a node.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

MARKER = "DGX_STAGE_TEST_RUN"
ENGINES = ("podman", "docker")
# The same Go template for both engines: full id, first name, status; a tab never appears in either.
PS_FORMAT = "{{.ID}}\t{{.Names}}\t{{.Status}}"


# -- mounts -----------------------------------------------------------------------------------------------------

def _unescape(field):
    """A mountinfo field with the kernel's octal escapes (\\040 space, \\011 tab, \\012 newline, \\134 backslash)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field) >= i + 4 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text):
    """The mounts of a /proc/<pid>/mountinfo text: dicts with id, parent, device, root, point, fstype, source."""
    mounts = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        dash = fields.index("-", 6)      # optional fields (shared:N, master:N) end at the lone "-"
        mounts.append({"id": int(fields[0]), "parent": int(fields[1]), "device": fields[2],
                       "root": _unescape(fields[3]), "point": _unescape(fields[4]),
                       "fstype": fields[dash + 1], "source": _unescape(fields[dash + 2])})
    return mounts


def _mount_key(mount):
    # Mount ids are reused once free: with the point, device, type and source, a new mount that took an old id
    # is still new.
    return (mount["id"], mount["point"], mount["device"], mount["fstype"], mount["source"])


# The container runtimes mount their own state on first use and keep it mounted for good (Podman's storage and
# network namespaces, dockerd's root and netns); a container's own mounts live there too, and a container left
# behind is named by the container check.
RUNTIME_STATE = ("/var/lib/containers/storage", "/run/containers/storage", "/run/netns", "/var/lib/docker",
                 "/run/docker")


def _runtime_state(point):
    return any(point == root or point.startswith(root + "/") for root in RUNTIME_STATE)


def new_mounts(before, after):
    """The mounts of `after` that `before` does not have, in mount order, but the runtimes' own state."""
    known = set(_mount_key(m) for m in before)
    return [m for m in after if _mount_key(m) not in known and not _runtime_state(m["point"])]


def read_mounts():
    with open("/proc/self/mountinfo") as handle:
        return parse_mountinfo(handle.read())


# -- containers -------------------------------------------------------------------------------------------------

def parse_ps(text):
    """The containers of `<engine> ps -a --no-trunc --format PS_FORMAT` output: dicts with id, name, status."""
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("\t", 2) + ["", ""]
        found.append({"id": parts[0].strip(), "name": parts[1].strip(), "status": parts[2].strip()})
    return found


def new_containers(before, after):
    """The containers of `after` (by id) that `before` does not have."""
    known = set(c["id"] for c in before)
    return [c for c in after if c["id"] not in known]


def _quiet_env():
    """This environment without the run's id: what the check starts itself is no leftover of the tests."""
    env = dict(os.environ)
    env.pop(MARKER, None)
    return env


def list_containers(engine):
    """The engine's containers, or None when it is not installed or does not answer (no daemon)."""
    try:
        proc = subprocess.run([engine, "ps", "-a", "--no-trunc", "--format", PS_FORMAT], env=_quiet_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return parse_ps(proc.stdout.decode("utf-8", "replace"))


# -- module payloads ----------------------------------------------------------------------------------------------

def payload_dirs(temp_dir=None, owner=None):
    """The names of the Ansible module payload directories (ansible_<module>_payload_<random>) in the temp dir
    that `owner` (default: this user) owns: another user's modules are not this run's."""
    temp_dir = temp_dir or tempfile.gettempdir()
    owner = os.geteuid() if owner is None else owner
    try:
        entries = list(os.scandir(temp_dir))
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith("ansible_") and "_payload_" in entry.name:
            try:
                if entry.stat(follow_symlinks=False).st_uid == owner:
                    found.append(entry.name)
            except OSError:
                pass
    return sorted(found)


# -- processes --------------------------------------------------------------------------------------------------

def _stat(pid):
    """(state, ppid, pgid, sid, start time in clock ticks) of a process, None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return (fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def _ancestors(pid):
    """pid and every process above it: the make and shell running the check carry the run's id too."""
    found = set()
    while pid > 0 and pid not in found:
        found.add(pid)
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return found


def carries(environ, marker):
    """True when a /proc/<pid>/environ text (NUL-separated bytes) sets MARKER to `marker`."""
    entry = ("%s=%s" % (MARKER, marker)).encode()
    return entry in environ.split(b"\0")


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def marked_processes(marker, exclude=()):
    """The running processes (not zombies) whose environment carries the run's id, but those in `exclude`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in exclude:
            continue
        pid = int(name)
        if not carries(_read("/proc/%d/environ" % pid), marker):
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        cmdline = _read("/proc/%d/cmdline" % pid).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        comm = _read("/proc/%d/comm" % pid).decode("utf-8", "replace").strip()
        found.append({"pid": pid, "state": stat[0], "ppid": stat[1], "pgid": stat[2], "sid": stat[3],
                      "age_s": _age(stat[4]), "comm": comm, "cmdline": cmdline or "[%s]" % comm})
    return sorted(found, key=lambda p: p["pid"])


def _age(start_ticks):
    try:
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return max(0, int(uptime - start_ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return None


# -- the two verbs ----------------------------------------------------------------------------------------------

def take_snapshot(marker):
    return {"marker": marker, "taken": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mounts": read_mounts(), "containers": dict((e, list_containers(e)) for e in ENGINES),
            "payloads": payload_dirs()}


def leftovers(snapshot, marker, grace=5.0):
    """(processes, mounts, containers, payload dirs) the run left: each a list, empty when nothing is left."""
    exclude = _ancestors(os.getpid())
    mounts = new_mounts(snapshot["mounts"], read_mounts())
    containers = []
    for engine in ENGINES:
        now = list_containers(engine)
        if not now:
            continue
        before = snapshot["containers"].get(engine)
        for container in new_containers(before or [], now):
            containers.append(dict(container, engine=engine, answered_before=before is not None))
    known = set(snapshot.get("payloads") or [])
    payloads = [os.path.join(tempfile.gettempdir(), n) for n in payload_dirs() if n not in known]
    deadline = time.monotonic() + grace
    while True:
        procs = marked_processes(marker, exclude)
        if not procs or time.monotonic() >= deadline:
            return procs, mounts, containers, payloads
        time.sleep(0.2)


def describe(procs, mounts, containers, payloads, marker):
    """The report lines: a heading and one line per leftover."""
    total = len(procs) + len(mounts) + len(containers) + len(payloads)
    lines = ["leftovers: %d thing(s) the test run %s started are still there:" % (total, marker)]
    for proc in procs:
        age = "" if proc["age_s"] is None else ", %d s old" % proc["age_s"]
        lines.append("  process %d (parent %d, session %d, group %d, state %s%s): %s" % (
            proc["pid"], proc["ppid"], proc["sid"], proc["pgid"], proc["state"], age, proc["cmdline"][:400]))
        if proc["comm"] == "dockerd":
            lines.append("    a Docker daemon the tests started and did not stop (scripts/docker-daemon.sh stop "
                         "stops the one it started)")
    for mount in mounts:
        lines.append("  mount %s (%s from %s), not there at the start" % (mount["point"], mount["fstype"],
                                                                          mount["source"]))
    for container in containers:
        why = "not there at the start" if container["answered_before"] else \
            "%s did not answer at the start" % container["engine"]
        lines.append("  container %s %s (name %s, %s), %s" % (container["engine"], container["id"][:12],
                                                              container["name"] or "-", container["status"], why))
    for path in payloads:
        lines.append("  module payload %s, not there at the start (its module was killed: give the test's playbook "
                     "runs a TMPDIR of their own)" % path)
    return lines


def main(argv):
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        sys.stderr.write(__doc__)
        return 2
    verb, path = argv
    marker = os.environ.get(MARKER, "")
    if not marker:
        sys.stderr.write("leftovers: %s is not set: `make test` sets it for its steps\n" % MARKER)
        return 2
    if verb == "snapshot":
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            os.makedirs(directory)
        tmp = "%s.tmp.%d" % (path, os.getpid())
        with open(tmp, "w") as handle:
            json.dump(take_snapshot(marker), handle)
        os.rename(tmp, path)
        return 0
    try:
        with open(path) as handle:
            snapshot = json.load(handle)
    except (OSError, ValueError) as err:
        sys.stderr.write("leftovers: no snapshot to compare with (%s): run `snapshot` first\n" % err)
        return 2
    if snapshot.get("marker") != marker:
        sys.stderr.write("leftovers: %s is from another run (%s, not %s)\n" % (path, snapshot.get("marker"), marker))
        return 2
    try:
        grace = float(os.environ.get("LEFTOVERS_GRACE", "5"))
    except ValueError:
        grace = 5.0
    found = leftovers(snapshot, marker, grace)
    if any(found):
        print("\n".join(describe(*found, marker=marker)))
        return 1
    print("leftovers: none (no process of test run %s, no new mount, container or module payload)" % marker)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
