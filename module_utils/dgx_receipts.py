"""Clear the engine's per-run receipt roots before serve.

The engine's receipt writer is strict-on-exists (mkdir(exist_ok=False), open('xb')), so a root
left by an earlier run (often root-owned) makes every restart fail with FileExistsError.
"""
import errno
import os
import re

from ansible.module_utils.dgx_errors import StageError, fix_command
from ansible.module_utils.dgx_fsutil import is_within, remove_path, walk_tree
from ansible.module_utils.dgx_mounts import describe_mount, mounts_below, parse_mountinfo

# The one place in code the receipt roots are named (the role's defaults and the module's docs hold them as text).
RECEIPT_ROOTS = ("ds41-backend-attestation", "ds41-combined-ready", "ds41-display-kv")

_EXAMPLE = "(e.g. /cache)"


def plan_removal(parent, names):
    """The receipt-root paths that exist (as anything, symlinks included); refuses a bad parent or name first."""
    if not parent or not os.path.isabs(parent):
        raise StageError("engine_receipts: parent %r is empty or relative; set receipt_parent to the absolute "
                         "directory holding the receipt roots %s" % (parent, _EXAMPLE))
    parent = os.path.normpath(parent)
    if parent == "/" or os.path.realpath(parent) == "/":
        raise StageError("engine_receipts: parent %r is (or resolves to) '/'; refusing to remove top-level "
                         "directories, set receipt_parent %s" % (parent, _EXAMPLE))
    for name in names:
        if not name or not name.strip() or "/" in name or "\0" in name or name == "." or ".." in name:
            raise StageError("engine_receipts: name %r must be a bare directory name (no '/', '.', '..', not "
                             "empty) such as ds41-combined-ready; fix receipt_roots" % name)
    paths = []
    for path in (os.path.join(parent, name) for name in names):
        try:
            os.lstat(path)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            raise StageError("engine_receipts: parent %s is not a directory; fix receipt_parent" % parent)
        paths.append(path)
    return list(dict.fromkeys(paths))


# /proc/<pid>/cgroup paths name a container by its 64-hex id (libpod-<id>.scope, /docker/<id>, cri-containerd-<id>).
_CONTAINER_ID = re.compile(r"(?:^|[/_:.-])([0-9a-f]{64})(?=\.scope|/|$)")


def read_text(path):
    """A /proc file as text (undecodable bytes kept as surrogates, as in os paths); None if unreadable."""
    try:
        with open(path, "rb") as handle:
            return os.fsdecode(handle.read())
    except OSError:
        return None


def container_of(cgroup_text):
    """The container id /proc/<pid>/cgroup names (docker, podman, containerd, CRI-O), or ""."""
    for line in (cgroup_text or "").splitlines():
        path = line.split(":", 2)[-1]
        found = _CONTAINER_ID.search(path)
        if found:
            return found.group(1)
    return ""


def mount_source(path, mounts):
    """(dev, path inside that filesystem) of a real path by the mounts of its namespace (the deepest mount point
    wins, of stacked mounts the last), or None."""
    under = [mount for mount in mounts if is_within(path, mount["mount_point"])]
    if not under:
        return None
    best = max(reversed(under), key=lambda mount: len(mount["mount_point"]))
    rel = os.path.relpath(path, best["mount_point"])
    inside = best["root"] if rel == "." else os.path.join(best["root"], rel)
    return best["dev"], os.path.normpath(inside)


def host_path(source, mounts):
    """The path that shows source, (dev, path inside that filesystem), in the namespace of mounts (the inverse of
    mount_source), or None when no mount shows it."""
    for mount in mounts:
        if mount["dev"] != source[0] or not is_within(source[1], mount["root"]):
            continue
        path = os.path.normpath(os.path.join(mount["mount_point"], os.path.relpath(source[1], mount["root"])))
        if mount_source(path, mounts) == source:
            return path
    return None


def fd_links(proc_root, pid):
    """[(link, its text)] of the open files of one process; none when they cannot be listed (gone, not ours). A
    text that cannot be read is "": the file still has an identity (its real path may exceed PATH_MAX)."""
    fd_dir = os.path.join(proc_root, pid, "fd")
    try:
        return [(link, _readlink(link)) for link in (os.path.join(fd_dir, fd) for fd in os.listdir(fd_dir))]
    except OSError:
        return []


def _readlink(link):
    try:
        return os.readlink(link)
    except OSError:
        return ""


def process_name(proc_root, pid):
    return (read_text(os.path.join(proc_root, pid, "comm")) or "").strip() or "?"


def _uses(proc_root, pid):
    """(how, (st_dev, st_ino), seen_as) of the cwd, open and mapped files of one process: os.stat follows the /proc
    magic link to the object itself, so the identity is the host's whatever path the process used."""
    cwd = os.path.join(proc_root, pid, "cwd")
    for how, link, seen_as in [("cwd", cwd, _readlink(cwd))] + [
            ("open", link, text) for link, text in fd_links(proc_root, pid)]:
        try:
            st = os.stat(link)
        except OSError:  # gone, or hidden from us
            continue
        yield how, (st.st_dev, st.st_ino), seen_as
    for line in (read_text(os.path.join(proc_root, pid, "maps")) or "").splitlines():
        fields = line.split(None, 5)
        try:
            major, minor = (int(part, 16) for part in fields[3].split(":"))
            inode = int(fields[4])
        except (IndexError, ValueError):
            continue
        if inode:
            yield "mapped", (os.makedev(major, minor), inode), (fields[5] if len(fields) > 5 else "")


def _namespace_key(proc_root, pid, mountinfo):
    """What tells mount namespaces apart: the ns/mnt link (root), else the mount table itself."""
    try:
        return os.readlink(os.path.join(proc_root, pid, "ns", "mnt"))
    except OSError:
        return mountinfo


class _Targets(object):
    """The receipt roots as the host sees them: every (dev, inode) under them, and what a mount would show when it
    binds a root, something in it, the receipt parent or a directory above it."""

    def __init__(self, roots, parent, host_mounts):
        self.roots = list(roots)
        self.parent = parent
        self.by_identity, self.unlisted = {}, []
        for root in self.roots:
            # What is held in a folder that cannot be listed, or whose entries cannot be stat'ed, is found by path.
            unlisted = []
            for path in [root] + [entry for entry, _rel, _is_dir in walk_tree(root, unlisted=unlisted)]:
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue        # gone meanwhile: nothing holds what is not there
                except OSError:
                    unlisted.append(os.path.dirname(path))
                    continue
                self.by_identity.setdefault((st.st_dev, st.st_ino), (root, path))
            self.unlisted += [(root, os.path.realpath(folder)) for folder in dict.fromkeys(unlisted)]
        # Mount points are real paths: a receipt_parent reached through a symlink is resolved first.
        self.sources = [(root, mount_source(os.path.realpath(root), host_mounts)) for root in self.roots]
        self.parent_source = mount_source(os.path.realpath(parent), host_mounts) if parent else None
        self.host_mounts = host_mounts

    def unlisted_holds(self, how, seen_as):
        """(how, path, seen_as, roots) when a file a process uses lies, by its path, in an unlisted folder under a
        root, or has a path too long to read (as the files of a folder unlisted for its length do), else None (a
        path of another namespace that happens to match refuses too: the safe error)."""
        for root, folder in self.unlisted:
            if not seen_as:
                return how, os.path.join(folder, "..."), seen_as, [root]
            if is_within(seen_as, folder):
                return how, seen_as, seen_as, [root]
        return None

    def holds(self, mounts):
        """[(how, host path, seen_as, roots)] of one namespace's mounts: a bind of a root, something in one or the
        parent ("mount"), else the closest directory above the parent bound read-write ("ancestor": the roots can
        be made through it)."""
        found, ancestor = [], None
        for mount in mounts:
            source, point = (mount["dev"], os.path.normpath(mount["root"])), mount["mount_point"]
            in_root = [(root, os.path.relpath(source[1], root_source[1])) for root, root_source in self.sources
                       if root_source and root_source[0] == source[0] and is_within(source[1], root_source[1])]
            if self.parent_source is not None and source == self.parent_source:
                found.append(("mount", self.parent, point, list(self.roots)))
            elif in_root:
                root, rel = in_root[0]
                found.append(("mount", root if rel == "." else os.path.join(root, rel), point, [root]))
            elif self.parent_source is not None and not mount["read_only"] and source[0] == self.parent_source[0] \
                    and is_within(self.parent_source[1], source[1]) \
                    and (ancestor is None or len(source[1]) > len(ancestor[0][1])):
                ancestor = source, point
        if ancestor and not any(held[1] == self.parent for held in found):
            source, point = ancestor
            shown = host_path(source, self.host_mounts) or "%s of device %d:%d" % ((source[1],) + source[0])
            found.append(("ancestor", shown, point, list(self.roots)))
        return found


def find_holders(roots, parent=None, proc_root="/proc", own_pid=None):
    """[{pid, name, container, how, path, seen_as, roots}]: who holds the (real) receipt roots as the host sees
    them: a cwd, open or mapped file under one (by st_dev/st_ino), or another mount namespace binding one, something
    in one, the parent, or read-write a directory above it (a live container that can reach the parent may write
    receipts at any time). The lowest pid speaks for its namespace's mounts."""
    if not roots:
        return []
    own = str(os.getpid() if own_pid is None else own_pid)
    own_mountinfo = read_text(os.path.join(proc_root, own, "mountinfo"))
    host_mounts = parse_mountinfo(own_mountinfo)
    targets = _Targets(roots, parent, host_mounts)
    # Another namespace's copy of one of our mounts (a systemd service's private namespace) is the
    # host's mount, not a bind into a container; it counts only inside a container.
    host_copies = set((m["dev"], m["root"], m["mount_point"]) for m in host_mounts)
    seen_namespaces = {_namespace_key(proc_root, own, own_mountinfo), own_mountinfo}
    try:
        pids = sorted((p for p in os.listdir(proc_root) if p.isdigit()), key=int)
    except OSError as exc:      # no process list: nobody can be shown not to hold the roots
        raise StageError("engine_receipts: cannot list %s (%s) to find who holds the receipt roots %s; nothing was "
                         "removed. Mount procfs there, or remove them anyway with receipt_force=true"
                         % (proc_root, exc.strerror or exc, ", ".join(roots)))
    holders = []
    for pid in pids:
        if pid == own:
            continue
        found = []
        for how, identity, seen_as in _uses(proc_root, pid):
            if identity in targets.by_identity:
                root, path = targets.by_identity[identity]
                found.append((how, path, seen_as, [root]))
            else:
                found += filter(None, [targets.unlisted_holds(how, seen_as)])
        container = container_of(read_text(os.path.join(proc_root, pid, "cgroup")))
        mountinfo = read_text(os.path.join(proc_root, pid, "mountinfo"))
        namespace = _namespace_key(proc_root, pid, mountinfo)
        if mountinfo is not None and namespace not in seen_namespaces:
            seen_namespaces.add(namespace)
            found += targets.holds([m for m in parse_mountinfo(mountinfo)
                                    if container or (m["dev"], m["root"], m["mount_point"]) not in host_copies])
        if not found:
            continue
        name = process_name(proc_root, pid)
        firsts = {}
        for how, path, seen_as, held_roots in found:
            firsts.setdefault((how, path), (seen_as, held_roots))
        holders += [{"pid": int(pid), "name": name, "container": container, "how": how, "path": path,
                     "seen_as": seen_as, "roots": held_roots} for (how, path), (seen_as, held_roots) in firsts.items()]
    return holders


_HOW = {"open": "has %s open", "cwd": "works in %s", "mapped": "maps %s", "mount": "binds %s",
        "ancestor": "mounts %s"}


def format_holder(holder):
    """'pid 42 (sleep, container 018a9bfdf3ce) has /c/ds41-x/w.json open (as /cache/ds41-x/w.json)'."""
    who = "pid %d (%s%s)" % (holder["pid"], holder["name"],
                             ", container %s" % holder["container"][:12] if holder["container"] else "")
    path = holder["path"]
    what = _HOW.get(holder["how"], "holds %s") % path
    if holder["how"] == "ancestor":
        # Receipt roots are direct children of the parent.
        what += " which contains %s, read-write at %s" % (os.path.dirname(holder["roots"][0]), holder["seen_as"])
    elif holder["how"] == "mount":
        if path not in holder["roots"] and not any(is_within(path, r) for r in holder["roots"]):
            what += ", the receipt parent,"
        what += " at %s" % holder["seen_as"]
    elif holder["seen_as"] and holder["seen_as"] != path:
        what += " (as %s)" % holder["seen_as"]
    return "%s %s" % (who, what)


def refusal_message(holders, paths, host=None):
    """The refusal: which roots, who holds them (and how), and what to do about it."""
    held = [p for p in paths if any(p in h["roots"] for h in holders)]
    # The holder may be an engine, a shell, a backup job...: name what to stop, not what it is.
    stop = list(dict.fromkeys("container %s" % h["container"][:12] if h["container"] else
                              "process pid %d (command %s)" % (h["pid"], h["name"]) for h in holders))
    return ("engine_receipts: refusing to remove receipt roots in use: %s. Held by %s. Stop %s first, "
            "or remove them anyway: %s"
            % (", ".join(held), "; ".join(format_holder(h) for h in holders), " and ".join(stop),
               fix_command("clean-receipts", host, "receipt_force=true")))


def clear_receipts(parent, names, force=False, check_mode=False, proc_root="/proc", live_container="", host=None):
    """Remove the listed receipt roots under parent (a symlink root is unlinked, its target left alone).

    Refuses, removing nothing, while a process holds a real root or one holds a mount point, unless force
    (which leaves each mount point and the folders holding it). Roots held only by live_container (the live
    run's) are kept. Returns {"would_remove", "removed", "kept", "holders", "mounts_kept"}."""
    paths = plan_removal(parent, names)
    # Holders only matter for real roots: a symlink root's target is never touched.
    real_roots = [p for p in paths if not os.path.islink(p)]
    try:
        holders = find_holders(real_roots, parent=os.path.dirname(paths[0]) if paths else None,
                               proc_root=proc_root)
    except StageError:
        if not force:
            raise
        holders = []
    live = (live_container or "").strip().lower()     # the full id, or a prefix of 12 or more
    strangers = [h for h in holders if not (len(live) >= 12 and h["container"].startswith(live))]
    if strangers and not force:
        raise StageError(refusal_message(strangers, paths, host))
    kept = [] if force else [p for p in paths if any(p in h["roots"] for h in holders)]
    plan = [p for p in paths if p not in kept]
    mounted = [(p, m) for p in plan if p in real_roots for m in mounts_below(p)]
    if mounted and not force:
        raise StageError(mount_refusal_message(mounted))
    result = {"would_remove": plan, "removed": [], "kept": kept, "holders": holders,
              "mounts_kept": sorted(set(m["mount_point"] for _p, m in mounted))}
    if check_mode:
        result["removed"] = list(plan)
        return result
    for path in plan:
        try:
            result["mounts_kept"] = sorted(set(result["mounts_kept"] + remove_root(path, around_mounts=force)))
        except (OSError, StageError) as exc:
            raise StageError("engine_receipts: cannot remove %s (part of it may be gone, the rest stays): %s; "
                             "roots removed before it: %s. %s"
                             % (path, exc, result["removed"] or "nothing",
                                "Run the play with become (root) or remove it by hand"
                                if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM) else "Remove it by hand"))
        result["removed"].append(path)
    return result


def mount_refusal_message(mounted):
    """Why receipt roots holding mount points are not removed: each mount and what it shows."""
    return ("receipt roots hold mount points: %s. dgx-stage never removes anything on another mount (a bind "
            "mount shows a folder from elsewhere, whose files would go); unmount them and run again. "
            "receipt_force removes the rest of the roots and still leaves each mount and what holds it; "
            "nothing was removed"
            % "; ".join("%s in %s (%s)" % (m["mount_point"], root, describe_mount(m)) for root, m in mounted))


def remove_root(path, attempts=3, around_mounts=False):
    """remove_path(path): the mount points it left in place (around_mounts; else one is refused). An entry another
    run removes meanwhile (ENOENT) is no failure: the removal is retried for what that run has yet to remove."""
    for attempt in range(attempts):
        try:
            left = remove_path(path, around_mounts=around_mounts)
            return [kept for kept, _why in left] if around_mounts and left else []
        except FileNotFoundError:
            if attempt == attempts - 1 and os.path.lexists(path):
                raise
    return []
