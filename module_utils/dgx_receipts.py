"""Clear the engine's per-run receipt roots before serve.

The engine's receipt writer is strict-on-exists (mkdir(exist_ok=False), open('xb')), so a root
left by an earlier run (often root-owned) makes every restart fail with FileExistsError.
"""
import os

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_within, remove_path

# The engine's per-run receipt roots: the one place in code their names are written. The tests, the
# demo and the Molecule checks read them from here; the receipt role's defaults and argument spec and
# engine_receipts' DOCUMENTATION hold them as literal text.
RECEIPT_ROOTS = ("ds41-backend-attestation", "ds41-combined-ready", "ds41-display-kv")
_DELETED_SUFFIX = " (deleted)"


def validate_parent(parent):
    """Return the absolute, normalised parent; refuse empty, relative and '/'."""
    if not parent or not str(parent).strip():
        raise StageError("engine_receipts: parent is empty; set receipt_parent to the directory "
                         "holding the receipt roots (e.g. /cache)")
    if not os.path.isabs(parent):
        raise StageError("engine_receipts: parent %r is relative; give an absolute path "
                         "(e.g. /cache)" % parent)
    normal = os.path.normpath(parent)
    if normal == "/" or os.path.realpath(normal) == "/":
        raise StageError("engine_receipts: parent %r is (or resolves to) '/'; refusing to remove "
                         "top-level directories, set receipt_parent to e.g. /cache" % parent)
    return normal


def validate_name(name):
    """Refuse a receipt-root name that could reach outside parent."""
    if not name or not str(name).strip():
        raise StageError("engine_receipts: an entry of names is empty; list bare directory names "
                         "such as ds41-combined-ready")
    if "/" in name or "\0" in name or name == "." or ".." in name:
        raise StageError("engine_receipts: name %r must be a bare directory name (no '/', '.', "
                         "'..'); fix receipt_roots" % name)
    return name


def plan_removal(parent, names):
    """Return the receipt-root paths that exist (as anything, symlinks included)."""
    parent = validate_parent(parent)
    paths = []
    for name in names:
        path = os.path.join(parent, validate_name(name))
        try:
            os.lstat(path)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            raise StageError("engine_receipts: parent %s is not a directory; fix receipt_parent"
                             % parent)
        if path not in paths:
            paths.append(path)
    return paths


def _linked_path(link):
    """The path a /proc link names, without the " (deleted)" the kernel appends for an unlinked file."""
    return link[:-len(_DELETED_SUFFIX)] if link.endswith(_DELETED_SUFFIX) else link


def _proc_name(proc_root, pid):
    try:
        with open(os.path.join(proc_root, pid, "comm")) as handle:
            return handle.read().strip() or "?"
    except OSError:
        return "?"


def _proc_links(proc_root, pid):
    """Yield the cwd and open-fd link targets of one process, skipping what vanished or is hidden."""
    base = os.path.join(proc_root, pid)
    try:
        yield os.readlink(os.path.join(base, "cwd"))
    except OSError:
        pass
    try:
        fds = os.listdir(os.path.join(base, "fd"))
    except OSError:
        return
    for fd in fds:
        try:
            yield os.readlink(os.path.join(base, "fd", fd))
        except OSError:
            continue


def find_holders(roots, proc_root="/proc", own_pid=None):
    """Return [{pid, name, path}] for live processes with a cwd or open file under any root.

    roots are compared by realpath because /proc links name resolved paths.
    """
    real_roots = [os.path.realpath(r) for r in roots]
    if not real_roots:
        return []
    own = str(os.getpid() if own_pid is None else own_pid)
    holders = []
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return []
    for pid in sorted(pids, key=int):
        if pid == own:
            continue
        for link in _proc_links(proc_root, pid):
            if any(is_within(_linked_path(link), root) for root in real_roots):
                holders.append({"pid": int(pid), "name": _proc_name(proc_root, pid), "path": link})
    return holders


def format_holders(holders):
    return "; ".join("pid %d (%s) holds %s" % (h["pid"], h["name"], h["path"]) for h in holders)


def clear_receipts(parent, names, force=False, check_mode=False, proc_root="/proc"):
    """Remove the listed receipt roots under parent.

    A root that is a symlink is unlinked (its target is left alone). Refuses, removing nothing,
    while a live process holds a file or cwd under a real root, unless force.
    Returns {"would_remove", "removed", "holders"}; in check mode removed == would_remove.
    """
    paths = plan_removal(parent, names)
    # Holders only matter for real directories: a symlink root's target is never touched.
    real_dirs = [p for p in paths if not os.path.islink(p)]
    holders = find_holders(real_dirs, proc_root=proc_root)
    if holders and not force:
        raise StageError("engine_receipts: refusing to remove receipt roots while in use: %s. "
                         "Stop the engine (or that process) first, or set force: true"
                         % format_holders(holders))
    result = {"would_remove": list(paths), "removed": [], "holders": holders}
    if check_mode:
        result["removed"] = list(paths)
        return result
    for path in paths:
        try:
            remove_path(path)
        except OSError as exc:
            raise StageError("engine_receipts: cannot remove %s: %s; removed so far: %s. "
                             "Run the play with become (root) or remove it by hand"
                             % (path, exc, result["removed"] or "nothing"))
        result["removed"].append(path)
    return result
