"""The peer folder: where a host of an earlier wave sends blobs it proved, checked before any is adopted.
"""
import os
import stat

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import is_within
from ansible.module_utils.dgx_localtree import linked_dir_problem
from ansible.module_utils.dgx_mounts import mount_point_problem
from ansible.module_utils.dgx_space import existing_ancestor


PEER_PARENT = "dgx-stage-peer"


def refuse_bad_peer_dir(req):
    """StageError unless peer_dir is this repo's candidate folder, a real directory on dest's mount: the run empties
    and removes it, so it must never hold another repo's candidates or anything else."""
    if not req.peer_dir:
        return
    wanted = os.path.join(req.dest, ".locks", PEER_PARENT, req.folder)
    fix = ("the run removes peer_dir and what is left in it, so it must be a scratch directory of its own inside "
           "dest: %s; nothing was written" % wanted)
    given = req.peer_dir_given
    if not os.path.isabs(given) or ".." in given.replace(os.sep, "/").split("/"):
        raise StageError("peer_dir %s is not an absolute path without '..' components: %s" % (given, fix))
    if req.peer_dir == req.dest:
        raise StageError("peer_dir %s is dest: %s" % (req.peer_dir, fix))
    if not is_within(req.peer_dir, req.dest):
        raise StageError("peer_dir %s is not inside dest %s: %s" % (req.peer_dir, req.dest, fix))
    if req.peer_dir != wanted:
        raise StageError("peer_dir %s is not this repo's candidate folder: its name must be %s and its parent's "
                         "%s, in dest's .locks: %s" % (req.peer_dir, req.folder, PEER_PARENT, fix))
    if os.path.isdir(req.dest):
        rel = os.path.relpath(req.peer_dir, req.dest).replace(os.sep, "/")
        problem = linked_dir_problem(req.dest, rel) or mount_point_problem(req.dest, rel)
        if problem:
            raise StageError("peer_dir %s: %s" % (req.peer_dir, problem))


def count_candidates(plan, req):
    """plan.peer_bytes: the writes whose blob peer_dir holds as a regular file of its size, its blocks on the disk of
    blobs/ (the space its removal gives back: a sparse file frees nothing); plan.peer_peak: the largest of them, one
    per worker, still there while copied."""
    if not req.peer_dir:
        return
    blobs_dev = os.lstat(existing_ancestor(os.path.join(plan.dest_repo, "blobs"))).st_dev
    sizes = []
    for work in plan.writes:
        try:
            st = os.lstat(os.path.join(req.peer_dir, work.etag)) if work.etag else None
        except OSError:
            continue
        if st and stat.S_ISREG(st.st_mode) and st.st_size == work.size <= st.st_blocks * 512 and st.st_dev == blobs_dev:
            sizes.append(work.size)
    sizes.sort(reverse=True)
    plan.peer_bytes = sum(sizes)
    plan.peer_peak = sum(sizes[:req.workers])
