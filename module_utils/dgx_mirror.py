"""Mirror one revision of one repo from a NAS hub cache to a local hub cache, verified: plan, refuse what the
disk cannot hold, apply under the repo lock, return the result.
"""
import copy
import time

from ansible.module_utils.dgx_copy import clear_peer_dir
from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_localtree import LocalTree
from ansible.module_utils.dgx_mirror_apply import Outcome, apply_plan, count_dangling
from ansible.module_utils.dgx_mirror_plan import plan_mirror
from ansible.module_utils.dgx_mirror_request import MirrorFailed, NotStaged, lock_dir_rel
from ansible.module_utils.dgx_mirror_result import failure_text, mirror_result, with_report
from ansible.module_utils.dgx_nas_suspects import remembered
from ansible.module_utils.dgx_progress_file import PassMeter
from ansible.module_utils.dgx_repolock import RepoLock
from ansible.module_utils.dgx_space import check_space, space_figures
from ansible.module_utils.dgx_throttle import set_io_priority
from ansible.module_utils.dgx_units import utc_text


def run_mirror(req, check_mode=False, progress=True):
    """The run's result; StageError for bad input, MirrorFailed (with the result) for what it could not stage."""
    started = time.monotonic()
    meter = PassMeter(req.phase, req.repo_id, req.verify, max_mib_s=req.max_mib_s)
    # Before any read, in this thread: the copy workers started later inherit the class.
    meter.io_priority = set_io_priority(req.io_priority, req.dest)
    if check_mode:
        return _check_mode_run(req, started, meter)
    early = _refuse_before_locking(req, started, meter)
    tree = LocalTree(req.dest)
    with RepoLock(tree, lock_dir_rel(req.folder), req.lock_timeout, req.run_id, req.on_lock_wait) as lock:
        if progress:
            meter.attach(lock.directory, held=lock.check_held)
        writing = []        # set once the run starts writing: only then is peer_dir removed
        try:
            try:
                result = _run_locked(req, meter, started, writing, early)
            finally:
                peer_problems = clear_peer_dir(tree, req.peer_dir) if writing else []
        except KeyboardInterrupt as exc:
            meter.close("interrupted", "interrupted (%s)" % (str(exc) or "Ctrl-C"))
            raise
        except MirrorFailed as exc:
            exc.result["warnings"].extend(peer_problems)
            meter.close("failed", str(exc))
            raise
        except BaseException as exc:
            meter.close("failed", str(exc) or type(exc).__name__)
            raise
        result["warnings"].extend(peer_problems)
        meter.close("ok")
    return result


def _run_locked(req, meter, started, writing, early=None):
    """The locked run; `writing` gets an item once it writes (a refusal before leaves peer_dir for the next run)."""
    if early is not None:
        refusal, found = early
        _remember(meter, found, [])
        raise refusal
    try:
        plan, refusal = plan_mirror(req, meter=meter), None
    except NotStaged as exc:
        plan, refusal = exc.plan, exc
    # What planning found corrupt on the NAS is kept when the run stops here (files not staged, no room).
    _remember(meter, plan.nas_corrupt, [])
    if refusal is not None:
        raise _refused(refusal, req, meter, started)
    space = check_space(plan, req)
    writing.append(True)
    outcome = Outcome()
    try:
        apply_plan(plan, req, outcome, meter)
    except StageError as exc:      # a full or failing disk: say what was done and found
        found = failure_text(req, plan, outcome)
        raise MirrorFailed("%s%s" % (exc, "; also: " + found if found else ""),
                           with_report(mirror_result(plan, req, outcome, space, [], started, meter), req, failed=True))
    finally:
        # What a pass found is kept when a full disk or Ctrl-C stops it too.
        _remember(meter, outcome.nas_corrupt, [w.etag for w in outcome.written if w not in outcome.from_peers])
    dangling = count_dangling(plan, req.dest)
    result = mirror_result(plan, req, outcome, space, dangling, started, meter)
    if outcome.failed:
        raise MirrorFailed(failure_text(req, plan, outcome), with_report(result, req, failed=True))
    if dangling:
        raise MirrorFailed("after staging, %d file(s) of %s still do not resolve to local files (e.g. %s): "
                           "the local disk changed under the run; re-run" % (len(dangling), req.repo_id, dangling[0]),
                           with_report(result, req, failed=True))
    return with_report(result, req)


def _check_mode_run(req, started, meter):
    """What the run would do, changing nothing; corrupt NAS blobs known and files not staged fail it."""
    try:
        plan = plan_mirror(req, check_mode=True, meter=meter)
    except NotStaged as exc:
        raise _refused(exc, req, meter, started, check_mode=True)
    result = mirror_result(plan, req, None, check_space(plan, req), [], started, meter)
    if plan.nas_corrupt:
        outcome = Outcome()
        outcome.nas_corrupt.extend(plan.nas_corrupt)
        raise MirrorFailed(failure_text(req, plan, outcome), with_report(result, req, check_mode=True, failed=True))
    return with_report(result, req, check_mode=True)


def _refused(exc, req, meter, started, check_mode=False):
    """MirrorFailed for a NotStaged refusal: the result of a run that did nothing, the paths unstaged."""
    outcome = Outcome()
    outcome.unavailable.update(exc.paths)
    result = mirror_result(exc.plan, req, outcome, space_figures(exc.plan, req), [], started, meter)
    return MirrorFailed(str(exc), with_report(result, req, check_mode=check_mode, failed=True))


def _refuse_before_locking(req, started, meter):
    """Refuse bad input before waiting on the lock (a verify-none plan); with corrupt NAS blobs found, (refusal,
    found) for the lock holder to record them first."""
    quick = copy.copy(req)
    quick.verify = "none"
    quick_meter = PassMeter(req.phase, req.repo_id, quick.verify)
    try:
        preflight = plan_mirror(quick, meter=quick_meter)
    except NotStaged as exc:
        preflight = exc
    except OSError:  # a run holding the lock changed the local copy under us: the locked plan decides
        preflight = None
    meter.add_reads(quick_meter)
    try:
        if isinstance(preflight, NotStaged):
            raise _refused(preflight, req, meter, started)
        if preflight is not None:
            check_space(preflight, quick)
    except StageError as exc:
        found = (preflight.plan if isinstance(preflight, NotStaged) else preflight).nas_corrupt
        if not found:
            raise
        return exc, found
    return None


def _remember(meter, found, proven):
    """Keep the corrupt NAS blobs `found` as suspects, less the `proven` (a NAS copy proved them)."""
    meter.suspects = remembered(meter.suspects, found, proven, utc_text(time.time()))
