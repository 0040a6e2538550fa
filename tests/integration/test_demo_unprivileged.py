"""`make demo` as an ordinary user (DESIGN: "it works for an unprivileged user too").

The user (nobody when the tests run as root) gets its own copy of the work tree, with a venv it can run
(tests/privilege.py nobody_venv), an empty HOME and TMPDIR, and runs `make demo` twice: both runs succeed
with no root and no sudo, no system package is installed, the NAS copy stays read-only (by permissions),
the second run changes nothing and prints a short output, and nothing is written outside .cache/demo of
its copy; then its `make clean` removes it all. As root the runs happen in a private mount namespace with
fresh tmpfs on /tmp, /var/tmp and /dev/shm (the places any user may write), so a stray temp file would be
seen too and none can stay behind.

This file is also the driver run inside that namespace (`python test_demo_unprivileged.py --in-namespace`).
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))   # tests/ (privilege), also when run as the namespace driver

from privilege import NOBODY, as_nobody, nobody_venv  # noqa: E402

MAX_LINES = 100
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def copy_worktree(dest):
    """The files git tracks and the untracked ones it does not ignore, as they are in the work tree."""
    listing = subprocess.check_output(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                      cwd=REPO_ROOT)
    for rel in sorted(set(listing.decode().split("\0")) - {""}):
        src, dst = os.path.join(REPO_ROOT, rel), os.path.join(dest, rel)
        if not os.path.lexists(src):
            continue   # deleted in the work tree
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def scan(roots):
    """{path: (type and mode, size, mtime_ns)} of everything below roots (links not followed); directories
    by type only (their mtime moves when an entry is added: the entry itself is what counts). The work
    tree under test is not watched (it may live in a temp dir, see namespace_main)."""
    found = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) != REPO_ROOT]
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                found[path] = ("dir",) if stat.S_ISDIR(st.st_mode) else (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def chown_tree(root, uid):
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def writable_entries(root):
    """Entries below root with a write bit (links aside): none, if the NAS copy is read-only."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o222:
                bad.append(os.path.relpath(path, root))
    return bad


def mark_front_end_installed(repo):
    """The copy's `make setup` stamp for the front end. Its name carries the work tree's path, so the copy
    would re-run the editable install into the shared venv, which the unprivileged user cannot write; the
    demo runs the copy's own dgx_stage (`python -m dgx_stage` from the copy) and needs no install."""
    stamp = subprocess.check_output(
        ["make", "-s", "--no-print-directory", "--eval", "print-pkg-stamp: ; @echo $(PKG_STAMP)", "print-pkg-stamp"],
        cwd=repo, universal_newlines=True).strip()
    if not os.path.exists(stamp):
        with open(stamp, "w") as handle:
            handle.write("copy of the work tree under test\n")


def run_demo(sandbox, watched):
    """Two `make demo` runs as the unprivileged user in a copy of the work tree under sandbox; what they
    printed and what they wrote outside the copy's .cache/demo (of everything below watched)."""
    repo, home, tmp = (os.path.join(sandbox, name) for name in ("repo", "home", "tmp"))
    copy_worktree(repo)
    venv = nobody_venv(os.path.join(REPO_ROOT, ".venv"), os.path.join(sandbox, "venv"))
    if venv is None:
        return {"skip": "no Python the unprivileged user can run for the project venv"}
    os.symlink(venv, os.path.join(repo, ".venv"))
    mark_front_end_installed(repo)
    os.makedirs(home)
    os.makedirs(tmp)
    if os.geteuid() == 0:
        for path in (repo, home, tmp):
            chown_tree(path, NOBODY)
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8",
           "ANSIBLE_NOCOLOR": "1"}
    before = scan(watched)
    runs = []
    for _ in range(2):
        proc = subprocess.run(["make", "demo"], cwd=repo, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=900, **as_nobody())
        runs.append({"rc": proc.returncode, "out": proc.stdout.decode("utf-8", "replace")})
    after = scan(watched)
    allowed = os.path.join(repo, ".cache", "demo")
    stray = sorted(path for path, state in after.items()
                   if before.get(path) != state and path != os.path.dirname(allowed)
                   and not (path + "/").startswith(allowed + "/"))
    nas = os.path.join(allowed, "nas")
    result = {"runs": runs, "stray": stray, "home": sorted(os.listdir(home)), "tmp": sorted(os.listdir(tmp)),
              "nas_writable": writable_entries(nas) if os.path.isdir(nas) else ["(no NAS copy at all)"],
              "report": os.path.isfile(os.path.join(allowed, "reports", "localhost.json"))}
    # The read-only NAS copy does not stop its owner's `make clean`.
    clean = subprocess.run(["make", "clean"], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=300, **as_nobody())
    result["clean"] = {"rc": clean.returncode, "out": clean.stdout.decode("utf-8", "replace"),
                       "left": os.path.lexists(os.path.join(repo, ".cache"))}
    return result


def namespace_main():
    """Inside `unshare --mount`: fresh tmpfs on the shared temp dirs, the sandbox in the new /tmp. A work
    tree that itself lives in a shared temp dir (a fresh clone in a mktemp dir) is bound back at its
    path, with traversable parents, so its venv stays reachable."""
    shared = [path for path in SHARED_TMP if os.path.isdir(path)]
    held = None
    if any((REPO_ROOT + "/").startswith(os.path.realpath(path) + "/") for path in shared):
        held = tempfile.mkdtemp(prefix="dgx-demo-repo-", dir="/run" if os.path.isdir("/run") else "/mnt")
        subprocess.check_call(["mount", "--bind", REPO_ROOT, held])
    for path in shared:
        subprocess.check_call(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", path])
    if held:
        os.makedirs(REPO_ROOT, mode=0o755)
        subprocess.check_call(["mount", "--move", held, REPO_ROOT])
        os.rmdir(held)
    sandbox = tempfile.mkdtemp(prefix="dgx-demo-", dir="/tmp")
    os.chmod(sandbox, 0o755)
    result = run_demo(sandbox, [path for path in SHARED_TMP if os.path.isdir(path)])
    print(json.dumps(result))


def demo_result(tmp_path):
    if os.geteuid() != 0:
        sandbox = str(tmp_path / "sandbox")
        os.makedirs(sandbox)
        return run_demo(sandbox, [sandbox])
    if not shutil.which("unshare"):
        pytest.skip("unshare(1) is needed to watch the shared temp dirs")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, os.path.abspath(__file__),
                           "--in-namespace"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-5000:]
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def test_make_demo_as_an_unprivileged_user(tmp_path):
    result = demo_result(tmp_path)
    if "skip" in result:
        pytest.skip(result["skip"])
    first, second = result["runs"]
    assert first["rc"] == 0, first["out"][-6000:]
    assert second["rc"] == 0, second["out"][-6000:]
    for run in (first, second):
        assert "sudo" not in run["out"] and "setup-system" not in run["out"], run["out"][-6000:]
    assert "built a synthetic NAS hub" in first["out"] and "changed=0" not in first["out"]
    # The second run: nothing to do, said briefly: one table per front-end run (stage, clean-receipts), each
    # under its one run id and saying it changed nothing; no second rendering of the same run.
    out = second["out"]
    titles = [line for line in out.splitlines() if re.match(r"^dgx-stage [a-z-]+: run \d{8}T\d{6}Z-[0-9a-f]{4}, ", line)]
    assert [t.split(",", 1)[1].strip() for t in titles] == ["0 changes", "0 changes"], out
    assert len([line for line in out.splitlines() if line.startswith("HOST ") and " RUN " in line]) == 2, out
    assert "PLAY RECAP" not in out and "LANE SUMMARY" not in out and "| HOST |" not in out, out
    assert len(out.splitlines()) < MAX_LINES, out
    # The NAS copy stayed read-only, the report was written, and nothing landed outside .cache/demo.
    assert result["nas_writable"] == []
    assert result["report"]
    assert result["stray"] == [] and result["home"] == [] and result["tmp"] == [], result
    assert result["clean"]["rc"] == 0 and not result["clean"]["left"], result["clean"]


if __name__ == "__main__" and sys.argv[1:] == ["--in-namespace"]:
    namespace_main()
