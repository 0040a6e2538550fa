"""What an operator reads: stage-deepseek.yml through plain ansible-playbook with the repo's ansible.cfg
(the dgx_stdout callback: only changed and failed results shown, then the lane summary the dgx_report callback
prints from the host reports of the run). The figures in the table are checked against the host reports. Only
what needs a real run is here; how the table renders a report is tests/unit/test_frontend_table.py's, the
summary around it tests/unit/test_dgx_summary.py's."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import processes
from dgx_stage.table import human_bytes
from conftest import BIN_DIR, REPO_ROOT, ansible_env, failures, own_environ, run_playbook
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_reports import write_lane
from test_stage_playbook import _corrupt_nas_shard, staged_localhost, write_inventory
from test_verify_and_progress import paced_python, progress_path, read_progress, to_copy
from treestate import sha256_file

MAX_LINES = 100
STAGE_TAGS = "preflight,stage,verify"
MIB = 1024 * 1024
CALLBACKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "callback_plugins")


def run_text(tmp_path, inventory, *args, results=False):
    """(exit code, output lines) of stage-deepseek.yml as an operator sees it; with results=True also the plays'
    results of that run as run_playbook() parses them (callback_plugins/json_file.py here writes them)."""
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK")    # the repo's ansible.cfg: the default callback
    if results:
        env["ANSIBLE_CALLBACK_PLUGINS"] = os.pathsep.join([os.path.join(REPO_ROOT, "callback_plugins"), CALLBACKS])
        env["ANSIBLE_CALLBACKS_ENABLED"] = "dgx_report,json_file"
        env["DGX_TEST_JSON_FILE"] = str(tmp_path / "results.json")
    proc = subprocess.run([os.path.join(BIN_DIR, "ansible-playbook"), "-i", str(inventory),
                           os.path.join(REPO_ROOT, "stage-deepseek.yml")] + list(args),
                          cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    lines = proc.stdout.decode("utf-8", "replace").splitlines()
    if not results:
        return proc.returncode, lines
    with open(env["DGX_TEST_JSON_FILE"]) as handle:
        return proc.returncode, lines, json.load(handle)


def host_inventory(tmp_path, nas, local, **host_vars):
    """write_inventory's one-host lane, with vars of the host itself (its interpreter, say)."""
    path = write_inventory(tmp_path, nas, local)
    with open(path) as handle:
        inventory = json.load(handle)
    inventory["all"]["children"]["exl3_2x"]["hosts"]["localhost"].update(host_vars)
    with open(path, "w") as handle:
        json.dump(inventory, handle)
    return path


def summary_table(lines):
    """The lane summary: (title line, [{column: cell}] a row per host, closing line, lines after it). The table
    comes in bands of columns, each led by HOST, cells aligned under their titles; a lane's Stage pass block
    (its windows and bytes) follows it."""
    titles = [i for i, line in enumerate(lines) if line.startswith("DGX-STAGE LANE SUMMARY")]
    assert len(titles) == 1, "\n".join(lines)
    start = titles[0]
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("wall time"))
    body = lines[start + 1:end]
    body = body[:body.index("Stage pass (UTC)")] if "Stage pass (UTC)" in body else body
    rows = {}
    for band in "\n".join(body).strip("\n").split("\n\n"):
        header, *cells = band.splitlines()
        assert header.startswith("HOST  "), header
        starts = [match.start() for match in re.finditer(r"(?:^|(?<=  ))\S", header)]
        spans = list(zip(starts, starts[1:] + [None]))
        for n, line in enumerate(cells):
            rows.setdefault(n, {}).update((header[a:b].strip(), line[a:b].strip()) for a, b in spans)
    return lines[start], [rows[n] for n in sorted(rows)], lines[end], lines[end + 1:]


def copied(report):
    """The COPIED cell of a host report: the bytes its stage and verify passes copied."""
    return human_bytes(sum(row["bytes_copied"] for name in ("stage", "verify")
                           for row in report["passes"].get(name, [])))


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
    title, rows, total, _after = summary_table(first)
    assert title == "DGX-STAGE LANE SUMMARY: lane exl3_2x, 1 host, run %s" % report["run_id"]
    assert [(r["HOST"], r["RUN"], r["STATUS"], r["REPAIRED"], r["VERIFY"]) for r in rows] == [
        ("localhost", report["run_id"], "ok", "0", "sample")]
    assert rows[0]["COPIED"] == copied(report) != "0 B"
    assert re.match(r"wall time \w+; 1/1 hosts ok; engine not started \(engine_enabled is false\)$", total), total

    code, second = run_text(tmp_path, inventory)
    assert code == 0 and recap(second, "localhost")["changed"] == 0, "\n".join(second)
    assert len(second) < MAX_LINES, "%d lines:\n%s" % (len(second), "\n".join(second))
    for repo in (MAIN_REPO, DRAFTER_REPO):      # no repo's unchanged result printed
        assert sum(line.count(repo) for line in second) == 0, "\n".join(second)
    _title, rows, total, _after = summary_table(second)
    assert [(r["COPIED"], r["MiB/s"], r["STATUS"]) for r in rows] == [("0 B", "-", "ok")]
    assert "; 1/1 hosts ok" in total


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
    report = json.loads((tmp_path / "reports" / "localhost.json").read_text())
    assert [(r["STATUS"], r["COPIED"]) for r in rows] == [("failed", copied(report))], rows
    assert re.search(r"; 0/1 hosts ok; FAILED: localhost", total), total
    assert after[0].startswith("host localhost failed in play stage, task Mirror | ") and shard in after[0], after
    step = after[1]
    assert step.startswith("next step: read the error above and the host report ")
    assert str(tmp_path / "reports" / "localhost.json") in step
    assert "ansible-playbook -i %s " % inventory in step and "--limit localhost" in step and "--tags stage" in step


STAGE_PASS = "Mirror | Each repo from the NAS hub to the local hub, pass stage"
MANIFEST_TAGS = ("--tags", "preflight,stage,verify,manifest")


def computed_manifests(data):
    """{host: the manifest the manifest play computed} of a json-callback run."""
    return dict((host, result["manifest"]) for each in data["plays"] for task in each["tasks"]
                if task["task"]["name"].split(" : ", 1)[-1].startswith("Manifest | Compute the mounts")
                for host, result in task["hosts"].items())


def printed_result_lines_name_their_host(lines):
    """Every result line printed names its host: nothing to untangle between the hosts of a lane."""
    for line in lines:
        if line.startswith(("changed:", "ok:", "failed:", "fatal:")):
            assert re.match(r"\w+: \[node\d\]", line), line


def task_block(lines, name):
    """The output lines of the task whose banner names `name` (banner to the next banner), all its hosts."""
    inside, block = False, []
    for line in lines:
        if line.startswith(("TASK [", "PLAY [", "PLAY RECAP")):
            inside = name in line
        elif inside:
            block.append(line)
    return block


def test_check_mode_on_a_fresh_lane_plans_once_per_host_writes_nothing_and_predicts_the_real_run(tmp_path, nas_hub):
    """Two hosts whose hub roots do not exist yet. --check --diff plans every copy and the manifest, the plan
    printed once per host (by the stage pass: preflight plans but reports no change), and creates nothing; the
    table says what would be copied. The real run copies that and writes the manifests --check predicted (files
    still to copy count as local, planned); --check on the staged lane then predicts no change."""
    hosts = ["node0", "node1"]
    inventory = write_lane(tmp_path, nas_hub["hub"], hosts)
    main_files, _main_bytes = to_copy(nas_hub)

    code, plan, data = run_text(tmp_path, inventory, "--check", "--diff", *MANIFEST_TAGS, results=True)
    assert code == 0, "\n".join(plan)
    # The plan as the plays return it.
    diffs, staged = {}, {}
    for each in data["plays"]:
        for task in each["tasks"]:
            name = task["task"]["name"].split(" : ", 1)[-1]
            for host, result in task["hosts"].items():
                for row in result.get("results", []):
                    if name.startswith("Mirror | Each repo") and name.endswith("pass preflight"):
                        assert row["changed"] is False and row["blobs"]["copied"] > 0     # planned, not done
                    if name == STAGE_PASS:
                        staged.setdefault(host, {})[row["item"]["repo_id"]] = row
                    if row.get("diff"):
                        diffs.setdefault(host, []).append((name, row["item"]["repo_id"], row["diff"]))
    assert sorted(diffs) == sorted(staged) == hosts
    for host in hosts:
        assert not data["stats"][host].get("failures"), data["stats"]
        assert staged[host][MAIN_REPO]["changed"] and staged[host][MAIN_REPO]["blobs"]["copied"] > 0
        assert [(n, r) for n, r, _d in diffs[host]] == [(STAGE_PASS, MAIN_REPO), (STAGE_PASS, DRAFTER_REPO)]
        headline = diffs[host][0][2]["prepared"].splitlines()[0]
        assert re.match(r"^would copy %d files, \d+\.\d (KiB|MiB|GiB);" % main_files, headline), headline
    predicted = computed_manifests(data)
    for host in hosts:
        local_targets = sorted(m["target"] for m in predicted[host]["mounts"] if m["origin"] == "local")
        assert local_targets and sorted(predicted[host].pop("planned")) == local_targets, host
        assert not (tmp_path / host).exists(), host         # no hub root, no manifest: --check wrote nothing

    # The same plan as an operator reads it: the table, and each copy line once per host.
    title, rows, total, _after = summary_table(plan)
    assert title.startswith("DGX-STAGE LANE SUMMARY: lane exl3_2x, 2 hosts")
    assert title.endswith("CHECK MODE (nothing was written)")
    assert [(r["HOST"], r["STATUS"], r["MiB/s"]) for r in rows] == [(host, "check", "-") for host in hosts]
    would = dict((r["HOST"], (r["FILES local/excl"], r["COPIED"])) for r in rows)
    assert all(cells[1] != "0 B" for cells in would.values()), would
    assert "; 2/2 hosts checked" in total, total
    text = "\n".join(plan)
    for host in hosts:
        blob_dir = os.path.join(str(tmp_path / host / "hub"), nas_hub["repos"][MAIN_REPO]["folder"], "blobs")
        copies = re.findall(r"^\+ copy %s/(\w+) " % re.escape(blob_dir), text, re.M)
        assert copies and sorted(copies) == sorted(set(copies)), copies            # one line per blob, once
    # The per-file plan once per host: every line naming a blob, but the manifest's (its diff names the blobs
    # again, as the sources of its mounts).
    manifest_diff = set(task_block(plan, "Manifest | Write the manifest"))
    assert manifest_diff
    for etag in [f["etag"] for f in nas_hub["repos"][MAIN_REPO]["files"].values() if f.get("etag")]:
        shown = [line for line in plan if etag in line and line not in manifest_diff]
        assert len(shown) <= len(hosts), shown
        for host in hosts:
            assert sum(str(tmp_path / host / "hub") in line for line in shown) <= 1, shown
    assert len(re.findall(r"^would copy \d+ files", text, re.M)) == 2 * len(hosts)    # a headline per repo
    printed_result_lines_name_their_host(plan)

    # The real run: what the plan said, one table with a row per host, and the predicted manifests.
    code, lines = run_text(tmp_path, inventory, *MANIFEST_TAGS)
    assert code == 0, "\n".join(lines)
    title, rows, total, after = summary_table(lines)
    assert title.startswith("DGX-STAGE LANE SUMMARY: lane exl3_2x, 2 hosts, run ")
    assert [(r["HOST"], r["STATUS"]) for r in rows] == [(host, "ok") for host in hosts]
    assert dict((r["HOST"], (r["FILES local/excl"], r["COPIED"])) for r in rows) == would   # as planned
    assert "; 2/2 hosts ok" in total and after == [""], (total, after)
    printed_result_lines_name_their_host(lines)
    for host in hosts:
        with open(str(tmp_path / host / "engine-mounts.json")) as handle:
            assert json.load(handle) == predicted[host], host

    # Staged: --check predicts no change (no planned mount in what the file would hold).
    code, data = run_playbook(tmp_path, inventory, "--check", *MANIFEST_TAGS)
    assert code == 0, failures(data)
    assert all(manifest.pop("planned") == [] for manifest in computed_manifests(data).values())
    assert all(data["stats"][host]["changed"] == 0 for host in hosts), data["stats"]


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


def test_swapped_and_flipped_shards_are_repaired_by_verify_and_the_table_and_report_say_so(staged_hub):
    """Staged, then on the node two same-size shards swapped (what a size-based dedup did: the stage pass,
    which reads no content, takes them as they are) and a byte flipped mid-shard in a third. With -e
    stage_verify=full the verify play repairs the three, warns once for each, and the table, the totals and
    the host report say so. Which verify mode catches which corruption is tests/unit/test_mirror.py's."""
    lane = staged_hub("localhost", staged_localhost)  # staged by a good run
    tmp_path, nas_hub, inventory, local_hub = lane["dir"], lane["nas"], lane["inventory"], lane["dir"] / "local"
    repo = nas_hub["repos"][MAIN_REPO]
    path_a, path_b = repo["same_size_pairs"][0]
    flip = next(p for p in repo["shards"] if p not in (path_a, path_b))
    blobs = local_hub / repo["folder"] / "blobs"
    blob_a, blob_b, blob_flip = (blobs / repo["files"][p]["etag"] for p in (path_a, path_b, flip))
    data_a, data_b = blob_a.read_bytes(), blob_b.read_bytes()
    blob_a.write_bytes(data_b)
    blob_b.write_bytes(data_a)
    data = bytearray(blob_flip.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob_flip.write_bytes(bytes(data))
    flipped = sha256_file(str(blob_flip))

    code, lines = run_text(tmp_path, inventory, "--tags", STAGE_TAGS, "-e", "stage_verify=full")
    assert code == 0, "\n".join(lines)
    _title, rows, total, _after = summary_table(lines)
    report = json.loads((tmp_path / "reports" / "localhost.json").read_text())
    assert [(r["COPIED"], r["REPAIRED"], r["VERIFY"], r["STATUS"]) for r in rows] == [
        (copied(report), "3", "full", "ok")], rows
    sizes = [repo["files"][p]["size"] for p in (path_a, path_b, flip)]
    assert sizes == [64 * 1024] * 3
    assert "; 1/1 hosts ok" in total, total
    # Each repair is said once, in a warning naming the path; the flip's names the blob and what it hashed to.
    said = re.sub(r"\s+", " ", "\n".join(lines))
    for path in (path_a, path_b, flip):
        assert said.count("repaired %s " % path) == 1, said
    assert re.search(r"repaired %s \(blobs/%s\) of %s: [^;]*; the local bytes hashed to %s;"
                     % (re.escape(flip), repo["files"][flip]["etag"], re.escape(MAIN_REPO), flipped), said), said

    assert [r["blobs"]["copied"] for r in report["passes"]["stage"]] == [0, 0]    # size looks fine to stage
    verified = dict((r["repo_id"], r) for r in report["passes"]["verify"])[MAIN_REPO]
    assert verified["blobs"]["repaired"] == 3 and verified["verify"] == "full", verified
    assert sorted(verified["repaired_paths"]) == sorted([path_a, path_b, flip])
    assert [r for r in verified["repairs"] if r["path"] == flip] == [{
        "path": flip, "paths": [flip], "blob": repo["files"][flip]["etag"], "reason": "content",
        "local_hash": flipped, "size": 64 * 1024}]
    _files, nbytes = to_copy(nas_hub)
    assert verified["bytes_read"] == {"local": nbytes, "nas": sum(sizes)}   # every local byte hashed; repairs copied
    assert blob_a.read_bytes() == data_a and blob_b.read_bytes() == data_b
    assert sha256_file(str(blob_flip)) == repo["files"][flip]["etag"]


def test_a_node_without_its_python_fails_in_preflight_and_its_host_report_says_so(tmp_path, nas_hub, local_hub):
    """The node's Python is missing: the run fails at its first module, in preflight, naming the interpreter. The
    host report is written on the controller all the same (it needs no Python of the node), says where the run
    failed, and the next step names it."""
    python = str(tmp_path / "no-python")
    inventory = host_inventory(tmp_path, nas_hub["hub"], str(local_hub), ansible_python_interpreter=python)
    code, lines = run_text(tmp_path, inventory)
    assert code != 0
    _title, _rows, _total, after = summary_table(lines)
    assert after[0].startswith("host localhost failed in play preflight, task "), after
    assert "The module interpreter '%s' was not found" % python in after[0], after
    report_file = tmp_path / "reports" / "localhost.json"
    assert after[1].startswith("next step: read the error above and the host report %s; " % report_file), after[1]
    report = json.loads(report_file.read_text())
    assert report["status"] == "failed" and report["failed_play"] == "preflight", report
    assert python in report["failed_msg"], report["failed_msg"]


def test_ctrl_c_still_prints_the_table_once_marked_interrupted(tmp_path, make_nas_hub, kill_at_teardown):
    """Ansible sends no stats on Ctrl-C: the table comes all the same, once, saying INTERRUPTED, which
    host did not finish and how to finish (every case of those lines: test_dgx_summary). Once its first play
    has ended, the run's host reports say running with no finish time: what a run killed mid-copy (SIGKILL:
    nothing more is written) leaves, and still so after the Ctrl-C - an interrupted or killed run never
    reads ok."""
    def run_reports():
        """{file name: parsed host report} of the run's stage_report_dir."""
        return dict((p.name, json.loads(p.read_text())) for p in sorted((tmp_path / "reports").iterdir()))

    nas = make_nas_hub(shard_size=16 * MIB, n_shards=4)
    local = tmp_path / "local"
    local.mkdir()
    inventory = host_inventory(tmp_path, nas["hub"], str(local),
                               ansible_python_interpreter=paced_python(tmp_path, delay=1.0))
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK")
    out_path = tmp_path / "playbook.out"
    with open(str(out_path), "wb") as out:
        proc = subprocess.Popen([os.path.join(BIN_DIR, "ansible-playbook"), "-i", inventory,
                                 os.path.join(REPO_ROOT, "stage-deepseek.yml"), "--tags", STAGE_TAGS],
                                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        path, deadline = progress_path(local, nas), time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            doc = read_progress(path)
            if doc and doc["pass"] == "stage" and doc["step"] == "copying" and doc["bytes_done"] > 0:
                break
            time.sleep(0.05)
        assert proc.poll() is None, out_path.read_text()
        # The workers have their own sessions and the stage job is daemonized: a Ctrl-C of the group misses them.
        kill_at_teardown(proc, environ=own_environ(tmp_path))
        # Mid-copy, what a SIGKILL here would leave: this run's reports, both files, say running, unfinished.
        mid_run = run_reports()
        os.killpg(proc.pid, signal.SIGINT)        # Ctrl-C: the whole foreground process group
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            processes.kill_tree(proc)
    lines = out_path.read_text().splitlines()
    assert code != 0, "\n".join(lines)
    title, rows, total, after = summary_table(lines)     # exactly one table
    assert title.endswith(", INTERRUPTED"), title
    assert [(r["STATUS"], r["COPIED"]) for r in rows] == [("interrupted", "-")], rows
    assert total.endswith("; 0/1 hosts ok; INTERRUPTED: localhost"), total
    assert after[0] == ("next step: the run was interrupted before localhost finished; what is staged is kept "
                        "and reused, so re-run: ansible-playbook -i %s stage-deepseek.yml --limit localhost "
                        "--tags %s" % (inventory, STAGE_TAGS)), after
    assert len(lines) < MAX_LINES, "\n".join(lines)
    run_id = re.search(r", run (\S+), INTERRUPTED$", title).group(1)
    for when, found in (("mid-copy", mid_run), ("after the Ctrl-C", run_reports())):
        assert sorted(found) == ["localhost-%s.json" % run_id, "localhost.json"], (when, sorted(found))
        for name, report in found.items():
            assert report["run_id"] == run_id and "preflight" in report["plays"], (when, name, report)
            assert report["status"] == "running" and report["finished"] is None, (when, name, report)
