"""The Makefile's install of the front end: `make setup` re-installs the editable package when the venv
last pointed it at another work tree (a clone sharing a venv, whose stamp said "done": dgx-stage then ran the
other tree's package and playbooks)."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tree(path):
    """The files `make setup` reads, in a work tree at `path`."""
    for directory in ("dgx_stage", "scripts"):
        os.makedirs(os.path.join(path, directory))
    for name in ("Makefile", "requirements.txt", "requirements.yml", "pyproject.toml",
                 os.path.join("scripts", "install-collections.py")):
        shutil.copy(os.path.join(REPO, name), os.path.join(path, name))
    return path


def up_to_date(path, venv):
    return subprocess.run(["make", "-q", "setup", "VENV=" + venv], cwd=path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


@pytest.mark.skipif(not shutil.which("make"), reason="no make")
def test_setup_reinstalls_the_front_end_for_another_work_tree_only(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for tool in ("python", "pip"):      # stand-ins: the test checks what make decides, not what they install
        (venv / "bin" / tool).write_text("#!/bin/sh\nexit 0\n")
        (venv / "bin" / tool).chmod(0o755)
    first, clone = tree(str(tmp_path / "main")), tree(str(tmp_path / "clone"))
    subprocess.run(["make", "-s", "setup", "VENV=" + str(venv)], cwd=first, check=True, stdout=subprocess.DEVNULL)
    assert up_to_date(first, str(venv))            # make setup twice: the second does nothing
    assert not up_to_date(clone, str(venv))        # the same files elsewhere: install it for this tree
    with open(os.path.join(first, "pyproject.toml"), "a") as handle:
        handle.write("\n# the package's metadata changed\n")
    assert not up_to_date(first, str(venv))
