"""dgx_receipts: clearing the engine's strict-on-exists receipt roots, safely."""
import os
import subprocess
import sys

import pytest

from ansible.module_utils.dgx_errors import StageError
from privilege import nobody_owned_dir, run_as_nobody
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS, clear_receipts, find_holders, plan_removal

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
        proc.kill()
        proc.wait()


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


def _fake_proc(tmp_path, pid, comm, links):
    base = tmp_path / "proc" / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "comm").write_text(comm + "\n")
    for i, link in enumerate(links):
        (base / "fd" / str(i)).symlink_to(link)
    return str(tmp_path / "proc")


def test_find_holders_skips_own_pid_and_matches_deleted_files(tmp_path):
    root = tmp_path / "cache" / NAMES[0]
    root.mkdir(parents=True)
    proc_root = _fake_proc(tmp_path, 10, "engine", [str(root / "worker.json") + " (deleted)"])
    _fake_proc(tmp_path, 11, "self", [str(root / "x")])
    _fake_proc(tmp_path, 12, "other", [str(root) + "-sibling/file", "/dev/null"])
    holders = find_holders([str(root)], proc_root=proc_root, own_pid=11)
    assert holders == [{"pid": 10, "name": "engine", "path": str(root / "worker.json") + " (deleted)"}]


def test_find_holders_compares_real_paths(tmp_path):
    real = tmp_path / "real-cache"
    (real / NAMES[0]).mkdir(parents=True)
    alias = tmp_path / "cache"
    alias.symlink_to(real)
    proc_root = _fake_proc(tmp_path, 20, "engine", [str(real / NAMES[0] / "w.json")])
    holders = find_holders([str(alias / NAMES[0])], proc_root=proc_root, own_pid=1)
    assert [h["pid"] for h in holders] == [20]


def test_own_process_holding_a_file_does_not_block(tmp_path):
    paths = make_roots(tmp_path)
    with open(os.path.join(paths[0], "worker.json")):
        assert clear_receipts(str(tmp_path), NAMES)["removed"] == paths
