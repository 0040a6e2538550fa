"""docs/runbooks/: how their ```console blocks are read and run (tests/runbook.py), and that each one is
listed where operators look for it. tests/integration/test_runbooks.py runs every runbook on a staged demo."""
import os

from runbook import excerpt_pattern, run_steps, runbook_steps

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNBOOK_DIR = os.path.join(REPO_ROOT, "docs", "runbooks")


def test_runbook_steps_parse_commands_exit_codes_and_excerpts():
    text = ("intro\n```console\n$ export DGX_STAGE_INVENTORY=inventory/dgx HOST=dgx2\n$ dgx-stage verify   # exits 2\n"
            "localhost   failed   verify ...\n...\n```\n```sh\n$ not run\n```\n"
            "```console\n$ dgx-stage report\nrun ... ok\n```\n")
    assert runbook_steps(text) == [
        {"command": "export DGX_STAGE_INVENTORY=inventory/dgx HOST=dgx2", "rc": 0, "expect": []},
        {"command": "dgx-stage verify   # exits 2", "rc": 2, "expect": ["localhost   failed   verify ..."]},
        {"command": "dgx-stage report", "rc": 0, "expect": ["run ... ok"]}]
    assert excerpt_pattern("localhost   failed   verify ...").search("localhost failed  verify: Verify | x")
    assert excerpt_pattern("run ... ok").search("run 20261201T100715Z-16cd ok")
    assert not excerpt_pattern("run ... ok").search("ok run")
    row = excerpt_pattern("localhost  20261201T101711Z-addc  ok  17/5  full")
    assert row.search("localhost  20261202T000000Z-9f9f  ok      17/5              full")
    assert not row.search("localhost  20261202T000000Z-9f9f  failed  17/5  full")
    assert excerpt_pattern("staged 2026-12-01T10:14:22Z;").search("staged 2027-01-02T03:04:05Z;")


def test_run_steps_keeps_exports_and_reports_each_exit_status(tmp_path):
    steps = runbook_steps("```console\n$ export LANE=demo\n$ echo \"lane $LANE in $PWD\"\n"
                          "$ false   # exits 1\n$ echo after\n```\n")
    results = run_steps(str(tmp_path), steps, str(tmp_path / "out"), dict(os.environ), 60)
    assert [(out.strip(), rc) for out, rc, _s in results] == [
        ("", 0), ("lane demo in %s" % tmp_path, 0), ("", 1), ("after", 0)]
    assert [s["rc"] for s in steps] == [0, 0, 1, 0]


def test_every_runbook_is_listed_in_the_index_and_the_readme():
    names = sorted(n for n in os.listdir(RUNBOOK_DIR) if n.endswith(".md") and n != "README.md")
    assert names
    with open(os.path.join(RUNBOOK_DIR, "README.md")) as handle:
        index = handle.read()
    with open(os.path.join(REPO_ROOT, "README.md")) as handle:
        readme = handle.read()
    for name in names:
        assert "(%s)" % name in index and "(docs/runbooks/%s)" % name in readme, name
