"""What an operator reads: stage-deepseek.yml through plain ansible-playbook with the repo's ansible.cfg
(default stdout callback, only changed and failed results shown, then the lane summary table of
callback_plugins/dgx_summary.py). The figures in the table are checked against the host reports."""
import json
import os
import re
import shutil
import subprocess
import sys

from conftest import BIN_DIR, REPO_ROOT, ansible_env
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_stage_playbook import _corrupt_nas_shard, write_inventory

MAX_LINES = 100
STAGE_TAGS = "preflight,stage,verify"
GIB = 1024.0 ** 3


def run_text(tmp_path, inventory, *args):
    """(exit code, output lines) of stage-deepseek.yml as an operator sees it."""
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK")    # the repo's ansible.cfg: the default callback
    proc = subprocess.run([os.path.join(BIN_DIR, "ansible-playbook"), "-i", str(inventory),
                           os.path.join(REPO_ROOT, "stage-deepseek.yml")] + list(args),
                          cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    return proc.returncode, proc.stdout.decode("utf-8", "replace").splitlines()


def summary_table(lines):
    """The lane summary: (title line, [{column: cell}], closing line, lines after it)."""
    titles = [i for i, line in enumerate(lines) if line.startswith("DGX-STAGE LANE SUMMARY")]
    assert len(titles) == 1, "\n".join(lines)
    start = titles[0]
    header = re.split(r"\s{2,}", lines[start + 1])
    assert header[:3] == ["HOST", "RANK", "REPO"], lines[start + 1]
    rows, end = [], start + 2
    while not lines[end].startswith("wall time"):
        rows.append(dict(zip(header, re.split(r"\s{2,}", lines[end], maxsplit=len(header) - 1))))
        end += 1
    return lines[start], rows, lines[end], lines[end + 1:]


def recap(lines, host):
    line = next(line for line in lines if line.startswith(host + " ") and " changed=" in line)
    return dict((key, int(value)) for key, value in re.findall(r"(\w+)=(\d+)", line))


def demo_inventory(tmp_path, make_nas_hub):
    """inventory/demo as it is, with its NAS hub (read-only) where the inventory looks: <root>/.cache/demo."""
    inventory = tmp_path / "inventory" / "demo"
    shutil.copytree(os.path.join(REPO_ROOT, "inventory", "demo"), str(inventory))
    nas = make_nas_hub(name=".cache/demo/nas")
    return inventory, tmp_path / ".cache" / "demo", nas


def test_no_op_rerun_of_the_demo_is_short_and_every_figure_is_in_the_table(tmp_path, make_nas_hub):
    inventory, demo_root, nas = demo_inventory(tmp_path, make_nas_hub)
    code, first = run_text(tmp_path, inventory)
    assert code == 0, "\n".join(first)
    report = json.loads((demo_root / "reports" / "localhost.json").read_text())
    stage = {row["repo_id"]: row for row in report["passes"]["stage"]}
    title, rows, total, _after = summary_table(first)
    assert title.startswith("DGX-STAGE LANE SUMMARY: lane exl3_2x, 1 host, run ")
    assert [(r["HOST"], r["RANK"], r["REPO"]) for r in rows] == [("localhost", "0", MAIN_REPO),
                                                                   ("localhost", "0", DRAFTER_REPO)]
    for row in rows:
        staged = stage[row["REPO"]]
        assert int(row["COPIED"]) == staged["blobs"]["copied"] > 0
        assert int(row["REUSED"]) == staged["blobs"]["reused"]
        assert row["REPAIRED"] == "0" and row["VERIFY"] == "sample" and row["STATUS"] == "ok"
        assert row["GiB"] == "%.2f" % (staged["bytes_copied"] / GIB)
    copied = sum(row["blobs"]["copied"] for row in stage.values())
    assert re.match(r"wall time [\d.]+ s; 1/1 hosts ok; copied %d files, [\d.]+ [KMG]iB; repaired 0; "
                    r"engine not started \(engine_enabled is false\)$" % copied, total)

    code, second = run_text(tmp_path, inventory)
    assert code == 0 and recap(second, "localhost")["changed"] == 0, "\n".join(second)
    assert len(second) < MAX_LINES, "%d lines:\n%s" % (len(second), "\n".join(second))
    for repo in (MAIN_REPO, DRAFTER_REPO):      # each repo's result once: its row of the table
        assert sum(line.count(repo) for line in second) == 1, "\n".join(second)
    _title, rows, total, _after = summary_table(second)
    assert [(r["COPIED"], r["MiB/s"], r["STATUS"]) for r in rows] == [("0", "-", "ok")] * 2
    assert [int(r["REUSED"]) for r in rows] == [stage[repo]["blobs"]["copied"] for repo in (MAIN_REPO, DRAFTER_REPO)]
    assert "copied 0 files, 0 B" in total


def test_a_failing_host_is_named_with_its_task_and_the_next_step(tmp_path, nas_hub, local_hub):
    shard = nas_hub["repos"][MAIN_REPO]["shards"][1]
    info = _corrupt_nas_shard(nas_hub, shard)
    inventory = write_inventory(tmp_path, nas_hub["hub"], str(local_hub))
    code, lines = run_text(tmp_path, inventory, "--tags", STAGE_TAGS)
    assert code != 0
    text = "\n".join(lines)
    # The failure itself is printed in full, where it happened.
    first = next(i for i, line in enumerate(lines) if line.startswith(("failed: [localhost]", "fatal: [localhost]")))
    shown = "\n".join(lines[first:next(i for i, line in enumerate(lines) if line.startswith("PLAY RECAP"))])
    assert shard in shown and info["etag"] in shown, text
    _title, rows, total, after = summary_table(lines)
    status = dict((r["REPO"], r["STATUS"]) for r in rows)
    assert status[MAIN_REPO].startswith("failed: stage: ") and "Mirror | " in status[MAIN_REPO], status
    assert status[DRAFTER_REPO] == "ok"
    assert re.search(r"; 0/1 hosts ok; copied \d+ files, [\d.]+ [KMG]?i?B; repaired 0; FAILED: localhost;",
                     total), total
    assert after[0].startswith("localhost failed in play stage, task ") and shard in after[0], after
    step = after[1]
    assert step.startswith("next step: read the error above and the host report ")
    assert str(tmp_path / "reports" / "localhost.json") in step
    assert "ansible-playbook -i %s " % inventory in step and "--limit localhost" in step and "--tags stage" in step


def test_check_mode_on_a_fresh_node_says_what_it_would_copy_and_prints_the_plan_once(tmp_path, nas_hub, local_hub):
    inventory = write_inventory(tmp_path, nas_hub["hub"], str(local_hub))
    code, plan = run_text(tmp_path, inventory, "--tags", STAGE_TAGS, "--check", "--diff")
    assert code == 0, "\n".join(plan)
    title, rows, total, _after = summary_table(plan)
    assert title.endswith("CHECK MODE (nothing was written)")
    assert {r["STATUS"] for r in rows} == {"check"} and {r["MiB/s"] for r in rows} == {"-"}
    would = re.search(r"would copy (\d+) files, ([\d.]+) GiB \([\d.]+ [KMG]iB\)$", total)
    assert would, total
    for etag in [f["etag"] for f in nas_hub["repos"][MAIN_REPO]["files"].values() if f.get("etag")]:
        assert sum(etag in line for line in plan) <= 1, etag    # the per-file plan once, not per pass

    code, real = run_text(tmp_path, inventory, "--tags", STAGE_TAGS)
    assert code == 0, "\n".join(real)
    _title, _rows, total, _after = summary_table(real)
    assert "copied %s files, " % would.group(1) in total


def test_a_three_host_local_lane_gives_one_table_with_a_row_per_host(tmp_path, nas_hub):
    hosts = ["node%d" % i for i in range(3)]
    inventory = {"all": {"children": {"exl3_2x": {"hosts": dict(
        (name, {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "hub_local_root": str(tmp_path / name / "hub")}) for name in hosts)}},
        "vars": {"lane": "exl3_2x", "hub_nas_root": nas_hub["hub"], "stage_repos": [{"repo_id": DRAFTER_REPO}],
                 "stage_report_dir": str(tmp_path / "reports"), "engine_enabled": False}}}
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory))
    code, lines = run_text(tmp_path, path, "--tags", STAGE_TAGS)
    assert code == 0, "\n".join(lines)
    title, rows, total, after = summary_table(lines)
    assert title.startswith("DGX-STAGE LANE SUMMARY: lane exl3_2x, 3 hosts")
    assert [(r["HOST"], r["RANK"], r["REPO"], r["STATUS"]) for r in rows] == [
        (name, str(rank), DRAFTER_REPO, "ok") for rank, name in enumerate(hosts)]
    copied = [int(r["COPIED"]) for r in rows]
    assert copied[0] > 0 and len(set(copied)) == 1
    assert "3/3 hosts ok; copied %d files" % sum(copied) in total and after == [""]
    # Every result line that is printed names its host: nothing to untangle between the hosts.
    for line in lines:
        if line.startswith(("changed:", "ok:", "failed:", "fatal:")):
            assert re.match(r"\w+: \[node\d\]", line), line


WARNING_MODULE = '''from ansible.module_utils.basic import AnsibleModule
module = AnsibleModule(argument_spec={"text": {"type": "str"}})
module.warn("repaired %s: the local bytes hashed to 0123abcd" % module.params["text"])
module.exit_json(changed=False)
'''


def test_warnings_of_unchanged_results_are_still_printed(tmp_path):
    """display_ok_hosts = false hides ok results and, in the default callback, their warnings: the summary
    callback prints them."""
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "warns.py").write_text(WARNING_MODULE)
    playbook = tmp_path / "warns.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - name: Warn once\n      warns:\n        text: config.json\n"
                        "    - name: Warn in a loop\n      warns:\n        text: 'shard {{ item }}'\n"
                        "      loop: [1, 2]\n")
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK")
    env["ANSIBLE_LIBRARY"] = str(tmp_path / "library")
    proc = subprocess.run([os.path.join(BIN_DIR, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, out
    assert "ok: [localhost]" not in out
    for text in ("config.json", "shard 1", "shard 2"):
        assert out.count("repaired %s: the local bytes hashed to 0123abcd" % text) == 1, out
