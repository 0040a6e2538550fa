"""dgx_receipts: clearing the engine's strict-on-exists receipt roots, safely."""
import os
import stat
import subprocess
import sys

import pytest

from ansible.module_utils.dgx_errors import StageError
import processes
from modrun import run_main
from mountns import bind_mount, in_private_mount_namespace
from privilege import nobody_owned_dir, run_as_nobody
from treestate import snapshot_diff, tree_snapshot
from ansible.module_utils import dgx_receipts
from ansible.module_utils.dgx_receipts import (RECEIPT_ROOTS, clear_receipts, container_of, find_holders,
                                              format_holder, host_path, mount_source, parse_mountinfo,
                                              plan_removal)

NAMES = list(RECEIPT_ROOTS)


def make_roots(parent, names=NAMES):
    for name in names:
        root = parent / name
        root.mkdir(parents=True)
        (root / "worker.json").write_text("{}")
    return [str(parent / n) for n in names]


def test_default_names_are_the_three_engine_roots():
    assert NAMES == ["ds41-backend-attestation", "ds41-combined-ready", "ds41-display-kv"]


def test_the_receipt_role_clears_the_same_roots_by_default():
    # The role's default (and its documented default) is the inventory-facing copy of RECEIPT_ROOTS.
    import yaml
    role = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles",
                        "receipt")
    with open(os.path.join(role, "defaults", "main.yml")) as handle:
        assert yaml.safe_load(handle)["receipt_roots"] == NAMES
    with open(os.path.join(role, "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    assert spec["receipt_roots"]["default"] == NAMES


def test_removes_listed_roots_and_nothing_else(tmp_path):
    paths = make_roots(tmp_path)
    (tmp_path / "ds41-other").mkdir()
    (tmp_path / "models").mkdir()
    result = clear_receipts(str(tmp_path), NAMES)
    assert result["removed"] == paths
    assert sorted(os.listdir(str(tmp_path))) == ["ds41-other", "models"]


def test_missing_roots_are_fine_and_second_run_changes_nothing(tmp_path):
    make_roots(tmp_path, NAMES[:1])
    assert clear_receipts(str(tmp_path), NAMES)["removed"] == [str(tmp_path / NAMES[0])]
    again = clear_receipts(str(tmp_path), NAMES)
    assert again["removed"] == [] and again["would_remove"] == []


def test_missing_parent_is_fine(tmp_path):
    assert clear_receipts(str(tmp_path / "absent"), NAMES)["removed"] == []


def test_check_mode_reports_and_touches_nothing(tmp_path):
    paths = make_roots(tmp_path)
    result = clear_receipts(str(tmp_path), NAMES, check_mode=True)
    assert result["removed"] == paths and result["would_remove"] == paths
    assert all(os.path.isfile(os.path.join(p, "worker.json")) for p in paths)


def test_removes_a_root_that_is_a_plain_file(tmp_path):
    (tmp_path / NAMES[1]).write_text("stale")
    assert clear_receipts(str(tmp_path), NAMES)["removed"] == [str(tmp_path / NAMES[1])]
    assert not (tmp_path / NAMES[1]).exists()


@pytest.mark.parametrize("parent", ["", "   ", "cache", "./cache", "/", "//", "/tmp/.."])
def test_refuses_bad_parent(parent):
    with pytest.raises(StageError, match="parent"):
        plan_removal(parent, NAMES)


def test_refuses_parent_resolving_to_root(tmp_path):
    link = tmp_path / "cache"
    link.symlink_to("/")
    with pytest.raises(StageError, match=r"resolves to\) '/'"):
        clear_receipts(str(link), NAMES)


@pytest.mark.parametrize("name", ["", " ", "a/b", "/etc", "..", ".", "../cache", "x/.."])
def test_refuses_bad_names_before_removing_anything(tmp_path, name):
    paths = make_roots(tmp_path, NAMES[:1])
    with pytest.raises(StageError, match="name"):
        clear_receipts(str(tmp_path), NAMES[:1] + [name])
    assert os.path.isdir(paths[0])


def test_symlink_root_is_unlinked_and_target_kept(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "worker.json").write_text("keep")
    parent = tmp_path / "cache"
    parent.mkdir()
    (parent / NAMES[0]).symlink_to(target)
    result = clear_receipts(str(parent), NAMES)
    assert result["removed"] == [str(parent / NAMES[0])]
    assert not os.path.lexists(str(parent / NAMES[0]))
    assert (target / "worker.json").read_text() == "keep"


@pytest.fixture
def owned_parent(tmp_path):
    yield from nobody_owned_dir(tmp_path, "dgx-receipts-")


def test_read_only_contents_are_removed_by_their_owner(owned_parent):
    def build_and_clear():
        root = owned_parent / NAMES[2]
        (root / "kv" / "0").mkdir(parents=True)
        (root / "kv" / "0" / "r.json").write_text("{}")
        os.chmod(str(root / "kv" / "0" / "r.json"), 0o444)
        os.chmod(str(root / "kv" / "0"), 0o555)
        os.chmod(str(root / "kv"), 0o000)
        os.chmod(str(root), 0o555)
        clear_receipts(str(owned_parent), NAMES)

    assert run_as_nobody(build_and_clear) == 0
    assert os.listdir(str(owned_parent)) == []


@pytest.mark.parametrize("mode", [0o000, 0o400], ids=["unlistable", "listable, not searchable"])
def test_a_file_held_open_in_a_folder_its_owner_cannot_list_is_still_seen(owned_parent, mode):
    """The owner made a folder unlistable (or its entries impossible to stat) after a process opened a file in
    it: the file's identity is out of sight, so the holder is found by the path the process has open, and the
    root is refused, not removed."""
    def hold_then_clear():
        root = owned_parent / NAMES[2]
        (root / "locked").mkdir(parents=True)
        (root / "locked" / "worker.json").write_text("{}")
        # A shell, not this interpreter: nobody may not reach the test's Python.
        holder = _start_holder(["sh", "-c", 'exec 3<"$1"; echo ready; exec sleep 60', "sh",
                                str(root / "locked" / "worker.json")])
        try:
            os.chmod(str(root / "locked"), mode)
            with pytest.raises(StageError) as refused:
                clear_receipts(str(owned_parent), NAMES)
            assert "%s open" % (root / "locked" / "worker.json") in str(refused.value), str(refused.value)
            assert os.path.isdir(str(root))
        finally:
            processes.kill_tree(holder)
            os.chmod(str(root / "locked"), 0o755)

    assert run_as_nobody(hold_then_clear) == 0


def _start_holder(args, cwd=None):
    """Start a child that prints 'ready' once it holds what it should hold."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


@pytest.fixture
def holder_procs():
    procs = []
    yield procs
    for proc in procs:
        processes.kill_tree(proc)


HOLD_OPEN = "import sys,time; f=open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"


def test_refuses_while_a_process_holds_an_open_file(tmp_path, holder_procs):
    paths = make_roots(tmp_path)
    held = os.path.join(paths[1], "worker.json")
    proc = _start_holder([sys.executable, "-c", HOLD_OPEN, held])
    holder_procs.append(proc)
    with pytest.raises(StageError) as err:
        clear_receipts(str(tmp_path), NAMES)
    msg = str(err.value)
    assert "pid %d" % proc.pid in msg
    assert "python" in msg  # the process name from /proc/<pid>/comm
    assert held in msg
    assert "force" in msg
    assert all(os.path.isdir(p) for p in paths), "nothing may be removed on refusal"


def test_refuses_while_a_process_has_its_cwd_inside(tmp_path, holder_procs):
    paths = make_roots(tmp_path)
    proc = _start_holder([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                         cwd=paths[0])
    holder_procs.append(proc)
    with pytest.raises(StageError, match="pid %d" % proc.pid):
        clear_receipts(str(tmp_path), NAMES, check_mode=True)
    assert all(os.path.isdir(p) for p in paths)


def test_refuses_while_a_process_holds_a_file_whose_real_path_is_too_long_for_its_fd_link(tmp_path, holder_procs):
    # receipt_parent reached through a short symlink: the walk lstats the held file by a path under PATH_MAX, but
    # its /proc fd link would spell the longer real path, so its text cannot be read (ENAMETOOLONG); stat can.
    real_parent = tmp_path
    for letter in "abc":
        real_parent = real_parent / (letter * 250)
    real_parent.mkdir(parents=True)
    parent = tmp_path / "p"
    parent.symlink_to(real_parent)
    folder = parent / NAMES[0]
    folder.mkdir()
    while len(str(folder)) < 3700:
        folder = folder / ("d" * 200)
        folder.mkdir()
    held = folder / "worker.json"
    held.write_text("{}")
    assert len(os.path.realpath(str(held))) > 4096
    holder_procs.append(_start_holder([sys.executable, "-c", HOLD_OPEN, str(held)]))
    with pytest.raises(StageError, match="pid %d" % holder_procs[0].pid):
        clear_receipts(str(parent), NAMES[:1])
    assert held.exists()


def test_refuses_while_a_process_holds_a_file_deeper_than_path_max_in_a_root(tmp_path, holder_procs):
    # Neither the walk (its lstat) nor the fd link (its text) can spell the held file's path: its folder is
    # unlisted and the file's link text unreadable, which refuses rather than removes.
    root = tmp_path / NAMES[0]
    root.mkdir()
    fd = os.open(str(root), os.O_RDONLY)
    for _level in range(24):
        os.mkdir("d" * 200, dir_fd=fd)
        child = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("worker.json", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, "/proc/self/fd/%d/worker.json" % fd], pass_fds=[fd],
                              stdout=subprocess.PIPE, cwd="/")
    holder_procs.append(holder)
    assert holder.stdout.readline().strip() == b"ready"
    os.close(fd)
    with pytest.raises(StageError, match="pid %d" % holder.pid):
        clear_receipts(str(tmp_path), NAMES[:1])
    assert root.is_dir()

def test_force_removes_despite_holder_and_reports_it(tmp_path, holder_procs):
    paths = make_roots(tmp_path)
    proc = _start_holder([sys.executable, "-c", HOLD_OPEN, os.path.join(paths[0], "worker.json")])
    holder_procs.append(proc)
    result = clear_receipts(str(tmp_path), NAMES, force=True)
    assert result["removed"] == paths
    assert [h["pid"] for h in result["holders"]] == [proc.pid]


def test_holder_of_a_symlink_roots_target_does_not_block(tmp_path, holder_procs):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "f").write_text("x")
    parent = tmp_path / "cache"
    parent.mkdir()
    (parent / NAMES[0]).symlink_to(target)
    holder_procs.append(_start_holder([sys.executable, "-c", HOLD_OPEN, str(target / "f")]))
    assert clear_receipts(str(parent), NAMES)["removed"] == [str(parent / NAMES[0])]
    assert (target / "f").exists()


# --- holders judged as the host sees them, on fake /proc trees -----------------------------------
# A fake /proc/<pid> has comm, cgroup, fd/N and cwd links, maps and mountinfo. Links point at real
# files so os.stat finds their (st_dev, st_ino); a container's view of a file is a hard link (same
# inode, another path), as a bind mount shows it.

HOST_NS = "mnt:[4026531832]"
PODMAN_ID = "018a9bfdf3cebcadf93f3007272220059bfe1e622297531dff97fad81746ce62"
DOCKER_ID = "5d1f0c3f2ab7d8a0e4c9b6f1a2e3d4c5b6a79808f7e6d5c4b3a2918070605040"


def _dev(path):
    st = os.stat(str(path))
    return "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))


def _mount_line(mount_id, root, point, dev, options="rw,relatime"):
    return "%d 1 %s %s %s %s - ext4 /dev/vda rw\n" % (mount_id, dev, root, point, options)


OVERLAY = "0:55"  # a container's own root filesystem: another device than the host's


class FakeProc(object):
    def __init__(self, tmp_path):
        self.base = tmp_path / "proc"
        self.base.mkdir()
        self.dev = _dev(tmp_path)
        # Our own process (pid 1 here): the host's mount namespace, the filesystem at /.
        self.host_mounts = _mount_line(27, "/", "/", self.dev)
        self.add(1, "ansible", mountinfo=self.host_mounts)

    @property
    def root(self):
        return str(self.base)

    def add(self, pid, comm, fds=(), cwd=None, maps="", mountinfo=None, ns=HOST_NS, cgroup="0::/\n"):
        proc = self.base / str(pid)
        (proc / "fd").mkdir(parents=True)
        (proc / "ns").mkdir()
        (proc / "comm").write_text(comm + "\n")
        (proc / "cgroup").write_text(cgroup)
        (proc / "maps").write_text(maps)
        (proc / "mountinfo").write_text(self.host_mounts if mountinfo is None else mountinfo)
        (proc / "ns" / "mnt").symlink_to(ns)
        for number, target in enumerate(fds):
            (proc / "fd" / str(number)).symlink_to(str(target))
        if cwd is not None:
            (proc / "cwd").symlink_to(str(cwd))


@pytest.fixture
def fake(tmp_path):
    """A receipt parent with the three roots (each with worker.json), a container's view of it, a /proc."""
    parent = tmp_path / "host" / "cache"
    make_roots(parent)
    view = tmp_path / "container" / "cache" / NAMES[1]   # what a container with parent at /cache sees
    view.mkdir(parents=True)
    os.link(str(parent / NAMES[1] / "worker.json"), str(view / "worker.json"))
    return {"parent": parent, "roots": [str(parent / n) for n in NAMES], "view": view, "proc": FakeProc(tmp_path)}


def holders_of(fake, roots=None):
    return find_holders(fake["roots"] if roots is None else roots, parent=str(fake["parent"]),
                        proc_root=fake["proc"].root, own_pid=1)


def test_an_open_file_is_found_by_its_identity_through_another_path(fake):
    held = fake["view"] / "worker.json"
    fake["proc"].add(41, "sleep", fds=[held, "/dev/null"], ns="mnt:[4026532249]",
                     cgroup="0::/libpod_parent/libpod-%s\n" % PODMAN_ID, mountinfo=_mount_line(84, "/", "/", OVERLAY))
    holders = holders_of(fake)
    host_path = str(fake["parent"] / NAMES[1] / "worker.json")
    assert holders == [{"pid": 41, "name": "sleep", "container": PODMAN_ID, "how": "open", "path": host_path,
                        "seen_as": str(held), "roots": [fake["roots"][1]]}]
    assert format_holder(holders[0]) == "pid 41 (sleep, container 018a9bfdf3ce) has %s open (as %s)" % (
        host_path, held)


def test_a_container_binding_the_parent_holds_every_root(fake):
    mounts = fake["proc"].host_mounts + _mount_line(84, os.path.realpath(str(fake["parent"])), "/cache",
                                                     fake["proc"].dev)
    fake["proc"].add(50, "catatonit", mountinfo=mounts, ns="mnt:[4026532300]",
                     cgroup="1:name=systemd:/docker/%s\n0::/\n" % DOCKER_ID)
    fake["proc"].add(51, "python3", mountinfo=mounts, ns="mnt:[4026532300]",
                     cgroup="1:name=systemd:/docker/%s\n0::/\n" % DOCKER_ID)
    holders = holders_of(fake)
    # One process speaks for the namespace.
    assert holders == [{"pid": 50, "name": "catatonit", "container": DOCKER_ID, "how": "mount",
                        "path": str(fake["parent"]), "seen_as": "/cache", "roots": fake["roots"]}]
    assert format_holder(holders[0]).endswith("binds %s, the receipt parent, at /cache" % fake["parent"])


def test_a_mount_of_something_inside_a_root_holds_that_root(fake):
    inside = os.path.realpath(str(fake["parent"] / NAMES[2] / "worker.json"))
    fake["proc"].add(60, "engine", ns="mnt:[4026532400]",
                     mountinfo=_mount_line(90, inside, "/receipts/w.json", fake["proc"].dev))
    holders = holders_of(fake)
    assert [(h["how"], h["path"], h["roots"], h["container"]) for h in holders] == [
        ("mount", inside, [fake["roots"][2]], "")]


def test_a_cwd_inside_a_root_through_an_alias(fake, tmp_path):
    alias = tmp_path / "alias"
    alias.symlink_to(str(fake["parent"]))
    fake["proc"].add(70, "bash", cwd=alias / NAMES[0])
    holders = holders_of(fake)
    assert [(h["pid"], h["how"], h["path"], h["roots"]) for h in holders] == [
        (70, "cwd", fake["roots"][0], [fake["roots"][0]])]


def test_a_mapped_file_by_device_and_inode(fake):
    st = os.stat(str(fake["parent"] / NAMES[0] / "worker.json"))
    maps = ("7f00-7f01 r--p 00000000 %02x:%02x %d /cache/%s/worker.json\n"
            "7f02-7f03 r-xp 00000000 00:00 0 [vdso]\n" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino,
                                                        NAMES[0]))
    fake["proc"].add(80, "engine", maps=maps)
    holders = holders_of(fake)
    assert [(h["how"], h["seen_as"], h["roots"]) for h in holders] == [
        ("mapped", "/cache/%s/worker.json" % NAMES[0], [fake["roots"][0]])]


def test_no_false_positive_for_neighbours_on_the_same_device(fake, tmp_path):
    other = tmp_path / "host" / "models"
    other.mkdir()
    (other / "shard.bin").write_text("x")
    st = os.stat(str(other / "shard.bin"))
    dev = fake["proc"].dev
    real_parent = os.path.realpath(str(fake["parent"]))
    # An open file and a mapping on the same device, and a cwd in the parent (not in a root).
    fake["proc"].add(90, "reader", fds=[other / "shard.bin"], cwd=fake["parent"],
                     maps="7f00-7f01 r--p 00000000 %02x:%02x %d /x\n" % (os.major(st.st_dev), os.minor(st.st_dev),
                                                                         st.st_ino))
    # Containers binding a neighbour, the parent's parent or / read-only (ancestors: a monitoring agent's
    # /host, by its mount options or its filesystem's), or a sibling whose name starts like a root.
    (fake["parent"] / (NAMES[0] + "-old")).mkdir()
    fake["proc"].add(91, "node_exporter", ns="mnt:[4026532500]", cgroup="0::/docker/%s\n" % DOCKER_ID,
                     mountinfo=(_mount_line(1, str(other), "/models", dev)
                                + _mount_line(2, os.path.dirname(real_parent), "/host", dev, "ro,relatime")
                                + _mount_line(3, "/", "/rootfs", dev).replace(" rw\n", " ro\n")
                                + _mount_line(4, os.path.join(real_parent, NAMES[0] + "-old"), "/old", dev)))
    # A mount of the parent's path on another device is another filesystem.
    fake["proc"].add(92, "other", ns="mnt:[4026532501]", mountinfo=_mount_line(1, real_parent, "/cache", "7:3"))
    assert holders_of(fake) == []


def test_the_hosts_own_mounts_are_not_holders(fake):
    # receipt_parent is itself a mount point on the host: every process of the host namespace, and a
    # service's private copy of that namespace, sees it mounted - none of them is a container binding it.
    real_parent = os.path.realpath(str(fake["parent"]))
    host = fake["proc"].host_mounts + _mount_line(30, real_parent, real_parent, fake["proc"].dev)
    fake["proc"].host_mounts = host
    (fake["proc"].base / "1" / "mountinfo").write_text(host)
    fake["proc"].add(2, "systemd-journal", mountinfo=host)
    fake["proc"].add(3, "systemd-logind", mountinfo=host, ns="mnt:[4026532600]",
                     cgroup="0::/system.slice/systemd-logind.service\n")
    assert holders_of(fake) == []
    # The same mount inside a container (same path on both sides) is a bind of the parent.
    fake["proc"].add(4, "engine", mountinfo=host, ns="mnt:[4026532601]", cgroup="0::/libpod-%s.scope\n" % PODMAN_ID)
    assert [(h["pid"], h["how"], h["container"]) for h in holders_of(fake)] == [(4, "mount", PODMAN_ID)]


def test_a_container_binding_an_ancestor_read_write_holds_every_root(fake):
    # podman run -v $W/host:/data: the receipt roots are /data/cache/<root> inside, and can be made there.
    real_parent = os.path.realpath(str(fake["parent"]))
    top = os.path.dirname(real_parent)
    dev = fake["proc"].dev
    fake["proc"].add(95, "sleep", ns="mnt:[4026532700]", cgroup="0::/libpod-%s.scope\n" % PODMAN_ID,
                     mountinfo=(_mount_line(1, "/", "/", OVERLAY) + _mount_line(2, "/", "/rootfs", dev)
                                + _mount_line(3, top, "/data", dev)))
    holders = holders_of(fake)
    # Of two read-write ancestors, the closest says how the container reaches the roots.
    assert holders == [{"pid": 95, "name": "sleep", "container": PODMAN_ID, "how": "ancestor", "path": top,
                        "seen_as": "/data", "roots": fake["roots"]}]
    assert format_holder(holders[0]) == ("pid 95 (sleep, container 018a9bfdf3ce) mounts %s which contains %s, "
                                         "read-write at /data" % (top, fake["parent"]))
    # A non-container namespace binding it counts too; its copy of the host's own / does not.
    fake["proc"].add(96, "unshare", ns="mnt:[4026532701]", mountinfo=fake["proc"].host_mounts + _mount_line(
        4, top, "/mnt/top", dev))
    assert [(h["pid"], h["how"], h["seen_as"]) for h in holders_of(fake)] == [
        (95, "ancestor", "/data"), (96, "ancestor", "/mnt/top")]


def test_an_ancestor_bind_is_named_by_the_filesystem_path_when_the_host_shows_it_nowhere():
    mounts = parse_mountinfo("27 1 254:0 / / rw - ext4 /dev/vda rw\n"
                             "40 27 259:1 /srv/cache /cache rw,relatime shared:5 - xfs /dev/nvme0n1 rw\n"
                             "41 27 259:2 / /cache/sub ro - xfs /dev/nvme1n1 rw\n"
                             "42 27 259:3 / /scratch rw - xfs /dev/nvme2n1 ro\n")
    assert [m["read_only"] for m in mounts] == [False, False, True, True]
    assert host_path(((259, 1), "/srv/cache/x"), mounts) == "/cache/x"
    assert host_path(((259, 1), "/srv"), mounts) is None           # above the only mount of that device
    assert host_path(((259, 1), "/srv/cache/sub"), mounts) is None  # covered by another mount
    assert host_path(((254, 0), "/cache"), mounts) is None          # the root filesystem's /cache is covered too


def test_a_refusal_names_what_to_stop_without_calling_it_an_engine(fake):
    fake["proc"].add(70, "sleep", cwd=fake["parent"] / NAMES[0])
    fake["proc"].add(71, "bash", fds=[fake["parent"] / NAMES[1] / "worker.json"])
    os.rename(fake["proc"].root + "/1", fake["proc"].root + "/%d" % os.getpid())
    with pytest.raises(StageError) as err:
        clear_receipts(str(fake["parent"]), NAMES, proc_root=fake["proc"].root)
    msg = str(err.value)
    assert "Stop process pid 70 (command sleep) and process pid 71 (command bash) first, or remove them anyway: " \
        "`dgx-stage clean-receipts -e receipt_force=true`" in msg
    assert "engine" not in msg.split(". Stop ")[1]


def test_a_root_removed_meanwhile_by_another_run_counts_as_removed(tmp_path, monkeypatch):
    paths = make_roots(tmp_path)
    real_remove = dgx_receipts.remove_path
    calls = []

    def racing(path, around_mounts=False):
        # The other run empties the root first: our removal of an entry it took finds nothing there.
        calls.append(path)
        if len(calls) == 1:
            real_remove(path, around_mounts=around_mounts)
            raise FileNotFoundError(2, "No such file or directory", os.path.join(path, "worker.json"))
        return real_remove(path, around_mounts=around_mounts)

    monkeypatch.setattr(dgx_receipts, "remove_path", racing)
    assert clear_receipts(str(tmp_path), NAMES)["removed"] == paths
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("error, hint", [
    (PermissionError(13, "Permission denied"), "Run the play with become (root) or remove it by hand"),
    (OSError(16, "Device or resource busy"), "Remove it by hand"),
])
def test_only_a_refused_permission_suggests_become(tmp_path, monkeypatch, error, hint):
    make_roots(tmp_path, NAMES[:1])

    def failing(path, around_mounts=False):
        raise error

    monkeypatch.setattr(dgx_receipts, "remove_path", failing)
    with pytest.raises(StageError) as err:
        clear_receipts(str(tmp_path), NAMES)
    assert str(err.value).endswith("roots removed before it: nothing. " + hint)


def test_own_pid_is_skipped(fake):
    (fake["proc"].base / "1" / "fd" / "3").symlink_to(str(fake["parent"] / NAMES[0] / "worker.json"))
    assert holders_of(fake) == []


@pytest.mark.parametrize("text, expected", [
    ("0::/libpod_parent/libpod-%s\n" % PODMAN_ID, PODMAN_ID),
    ("0::/machine.slice/libpod-%s.scope/container\n" % PODMAN_ID, PODMAN_ID),
    ("12:pids:/docker/%s\n0::/\n" % DOCKER_ID, DOCKER_ID),
    ("0::/system.slice/docker-%s.scope\n" % DOCKER_ID, DOCKER_ID),
    ("0::/kubepods.slice/cri-containerd-%s.scope\n" % DOCKER_ID, DOCKER_ID),
    ("4:memory:/process_api/7027291e6e7a8211a3e567a2d813e0b4\n0::/\n", ""),  # 32 hex: not a container
    ("0::/user.slice/user-1000.slice/session-3.scope\n", ""),
    ("", ""),
])
def test_container_of(text, expected):
    assert container_of(text) == expected


def test_parse_mountinfo_unescapes_paths_and_mount_source_takes_the_deepest_mount():
    text = ("27 1 254:0 / / rw - ext4 /dev/vda rw\n"
            "40 27 259:1 /srv/raid\\040cache /raid\\040cache rw,relatime shared:5 - xfs /dev/nvme0n1 rw\n"
            "41 27 259:2 / /raid\\040cache/sub rw - xfs /dev/nvme1n1 rw\n"
            "42 27 259:3 / /raid\\040cache/sub rw - xfs /dev/nvme2n1 rw\n")
    mounts = parse_mountinfo(text)
    assert mounts[1] == {"id": 40, "dev": (259, 1), "root": "/srv/raid cache", "mount_point": "/raid cache",
                         "read_only": False, "fstype": "xfs", "source": "/dev/nvme0n1"}
    assert mount_source("/raid cache/ds41-x", mounts) == ((259, 1), "/srv/raid cache/ds41-x")
    assert mount_source("/raid cache", mounts) == ((259, 1), "/srv/raid cache")
    assert mount_source("/raid cache/sub/x", mounts) == ((259, 3), "/x")  # the last of stacked mounts
    assert mount_source("/raid cachex", mounts) == ((254, 0), "/raid cachex")


def test_clear_receipts_refuses_naming_root_holder_and_fix(fake):
    fake["proc"].add(41, "sleep", fds=[fake["view"] / "worker.json"], ns="mnt:[4026532249]",
                     cgroup="0::/libpod_parent/libpod-%s\n" % PODMAN_ID,
                     mountinfo=_mount_line(84, os.path.realpath(str(fake["parent"])), "/cache", fake["proc"].dev))
    os.rename(fake["proc"].root + "/1", fake["proc"].root + "/%d" % os.getpid())  # clear_receipts' own pid
    with pytest.raises(StageError) as err:
        clear_receipts(str(fake["parent"]), NAMES, proc_root=fake["proc"].root)
    msg = str(err.value)
    assert "in use: %s." % ", ".join(fake["roots"]) in msg
    assert "pid 41 (sleep, container 018a9bfdf3ce) has %s/worker.json open (as %s/worker.json)" % (
        fake["roots"][1], fake["view"]) in msg
    assert "binds %s, the receipt parent, at /cache" % fake["parent"] in msg
    assert "Stop container 018a9bfdf3ce first, or remove them anyway: `dgx-stage clean-receipts" in msg
    assert all(os.path.isdir(p) for p in fake["roots"])

    # This host's live engine: its receipts are kept, not refused; anyone else still refuses.
    kept = clear_receipts(str(fake["parent"]), NAMES, proc_root=fake["proc"].root, live_container=PODMAN_ID[:12])
    assert (kept["kept"], kept["removed"], kept["would_remove"]) == (fake["roots"], [], [])
    with pytest.raises(StageError, match="refusing"):
        clear_receipts(str(fake["parent"]), NAMES, proc_root=fake["proc"].root, live_container=DOCKER_ID)
    with pytest.raises(StageError, match="refusing"):  # too short to name one container
        clear_receipts(str(fake["parent"]), NAMES, proc_root=fake["proc"].root, live_container=PODMAN_ID[:4])

    forced = clear_receipts(str(fake["parent"]), NAMES, proc_root=fake["proc"].root, force=True)
    assert forced["removed"] == fake["roots"] and forced["kept"] == []
    assert sorted((h["pid"], h["how"]) for h in forced["holders"]) == [(41, "mount"), (41, "open")]


def test_refuses_when_the_process_list_cannot_be_read_and_force_removes(fake, tmp_path):
    """Without a process list nobody can be shown not to hold a root: refuse, naming the fix."""
    not_a_folder = tmp_path / "proc-file"
    not_a_folder.write_text("")
    with pytest.raises(StageError, match="cannot list %s .*nothing was removed" % not_a_folder):
        clear_receipts(str(fake["parent"]), NAMES, proc_root=str(not_a_folder))
    assert all(os.path.isdir(p) for p in fake["roots"])
    forced = clear_receipts(str(fake["parent"]), NAMES, proc_root=str(not_a_folder), force=True)
    assert forced["removed"] == fake["roots"] and forced["holders"] == []


def test_own_process_holding_a_file_does_not_block(tmp_path):
    paths = make_roots(tmp_path)
    with open(os.path.join(paths[0], "worker.json")):
        assert clear_receipts(str(tmp_path), NAMES)["removed"] == paths


# --- the module itself, through main() -----------------------------------------------------------

def test_module_check_mode_then_removal_then_an_idle_rerun(tmp_path):
    parent = tmp_path / "cache"
    for name in NAMES:
        (parent / name / "run").mkdir(parents=True)
        (parent / name / "run" / "worker.json").write_text("{}")
        os.chmod(str(parent / name / "run" / "worker.json"), 0o444)
    expected = [str(parent / n) for n in NAMES]
    before = tree_snapshot(parent)

    checked = run_main("engine_receipts", {"parent": str(parent)}, check_mode=True)
    assert checked["changed"] is True and checked["removed"] == expected
    assert snapshot_diff(before, tree_snapshot(parent)) == []

    first = run_main("engine_receipts", {"parent": str(parent), "state": "absent"})
    assert first["changed"] is True and first["removed"] == expected
    assert os.listdir(str(parent)) == []

    second = run_main("engine_receipts", {"parent": str(parent)})
    assert second["changed"] is False and second["removed"] == []


def test_module_refuses_the_root_as_parent():
    result = run_main("engine_receipts", {"parent": "/"})
    assert result["failed"] and "'/'" in result["msg"]


@pytest.mark.parametrize("force", [False, True], ids=["refused", "force"])
@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_bind_mount_inside_a_receipt_root_is_never_entered(tmp_path, force, kind):
    """A folder (or a file) from elsewhere bind-mounted inside a receipt root (same filesystem, same
    st_dev): without force the clean-up refuses before removing anything, naming the mount; with force it
    removes the rest and leaves the mount and what it shows, its mode too (a read-only folder there is
    not given u+rwx)."""
    parent = tmp_path / "cache"
    make_roots(parent)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "weights.bin").write_bytes(b"not a receipt")
    if kind == "folder":
        mount_point, source = parent / NAMES[1] / "models", elsewhere
        mount_point.mkdir()
    else:
        mount_point, source = parent / NAMES[1] / "models.bin", elsewhere / "weights.bin"
        mount_point.write_bytes(b"")
    os.chmod(str(elsewhere), 0o555)

    def clean_up_with_the_mount():
        bind_mount(source, mount_point)
        before = tree_snapshot(parent)
        if not force:
            with pytest.raises(StageError) as refused:
                clear_receipts(str(parent), NAMES)
            assert "%s in %s (" % (mount_point, parent / NAMES[1]) in str(refused.value)
            assert "nothing was removed" in str(refused.value)
            assert snapshot_diff(before, tree_snapshot(parent)) == []
            return
        result = clear_receipts(str(parent), NAMES, force=True)
        assert result["mounts_kept"] == [str(mount_point)]
        assert not os.path.exists(str(parent / NAMES[0])) and not os.path.exists(str(parent / NAMES[2]))
        assert sorted(os.listdir(str(parent / NAMES[1]))) == [mount_point.name]
        assert open(str(source if kind == "file" else mount_point / "weights.bin"), "rb").read() == b"not a receipt"

    assert in_private_mount_namespace(clean_up_with_the_mount) == 0
    assert (elsewhere / "weights.bin").read_bytes() == b"not a receipt"
    assert stat.S_IMODE(os.stat(str(elsewhere)).st_mode) == 0o555
    os.chmod(str(elsewhere), 0o755)


def test_a_mount_made_after_the_check_stops_the_removal_at_the_mount(tmp_path):
    """The removal checks each folder it opens too: a mount made after clear_receipts' check is not entered."""
    root = tmp_path / "cache" / NAMES[1]
    (root / "models").mkdir(parents=True)
    (root / "a.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "weights.bin").write_bytes(b"not a receipt")

    def remove_with_the_mount():
        bind_mount(elsewhere, root / "models")
        with pytest.raises(StageError) as refused:
            dgx_receipts.remove_root(str(root))
        assert "%s is a mount point (" % (root / "models") in str(refused.value)
        assert (root / "models" / "weights.bin").read_bytes() == b"not a receipt"

    assert in_private_mount_namespace(remove_with_the_mount) == 0
    assert (elsewhere / "weights.bin").read_bytes() == b"not a receipt"
