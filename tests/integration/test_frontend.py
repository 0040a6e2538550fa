"""The `dgx-stage` front end through real ansible-runner runs of stage-deepseek.yml.

Each test runs `python -m dgx_stage` (the work tree's package, as .venv/bin/dgx-stage runs it) against a
throwaway local lane in the style of test_reports.py, with stdout a pipe (plain lines, no escape codes).
The copies that must be watched read their NAS at a known pace (test_verify_and_progress.paced_python) and
the stage pass polls every second, so a few seconds of copying give several progress events.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import processes
from conftest import REPO_ROOT, ansible_env, own_environ
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_reports import staged_rank0_rank1
from test_verify_and_progress import lane, paced_python

sys.path.insert(0, REPO_ROOT)
from dgx_stage import table  # noqa: E402
from ansible.module_utils.dgx_localtree import LocalTree
from ansible.module_utils.dgx_repolock import RepoLock

MIB = 1024 * 1024
PACED_SHARD = 32 * MIB     # 4 shards at 0.25 s per 8 MiB chunk, one worker: ~4 s of copying
PACED_DELAY_S = 0.25
POLL = ["-e", "stage_poll_interval=1"]


def frontend_env(tmp_path):
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)   # ansible-runner brings its own
    env["DGX_STAGE_RUNS_DIR"] = str(tmp_path / "runs")
    return env


def frontend_command(*args):
    return [sys.executable, "-m", "dgx_stage"] + list(args)


def dgx_stage(tmp_path, *args, timeout=600):
    """(exit code, output) of one front-end command, run to its end."""
    proc = subprocess.run(frontend_command(*args), cwd=REPO_ROOT, env=frontend_env(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def paced_lane(tmp_path, make_nas_hub, hosts=("dgx1",), **extra):
    nas = make_nas_hub(shard_size=PACED_SHARD, n_shards=4)
    inventory, roots = lane(tmp_path, nas, hosts=hosts, interpreter=paced_python(tmp_path, delay=PACED_DELAY_S),
                            stage_workers=1, **extra)
    for root in roots.values():
        root.mkdir(parents=True)
    return nas, inventory, roots


def run_records(tmp_path):
    runs_dir = tmp_path / "runs"
    return [json.loads((runs_dir / name / "run.json").read_text()) for name in sorted(os.listdir(str(runs_dir)))]


def job_events(record):
    events_dir = os.path.join(record["artifacts"], "job_events")
    out = []
    for name in os.listdir(events_dir):
        with open(os.path.join(events_dir, name)) as handle:
            out.append(json.load(handle))
    return sorted(out, key=lambda e: e["counter"])


def plain_row(output, host):
    """The cells of host's row of the plain final table (columns split on 2+ spaces), its bands joined."""
    lines = output.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith("HOST ") and "RUN" in line][-1]
    cells = []
    for line in lines[header + 1:]:
        if line.startswith(("Stage pass", "artifacts:")):
            break
        if line.startswith(host + " "):
            row = re.split(r"\s{2,}", line.strip())
            cells += row[1:] if cells else row
    assert cells, "no row for %s in:\n%s" % (host, output)
    return cells


def markdown_row(output, host):
    for line in output.splitlines():
        if line.startswith("| " + host + " "):
            return [cell.strip().replace("\\", "") for cell in line.strip("|").split(" | ")]
    raise AssertionError("no Markdown row for %s in:\n%s" % (host, output))


def expected_row(report, receipts=None):
    row = table.host_row(report, receipts)
    return [row[key] for key, _title in table.COLUMNS]


def test_stage_shows_progress_per_poll_and_a_table_with_the_reports_figures(tmp_path, make_nas_hub):
    nas, inventory, roots = paced_lane(tmp_path, make_nas_hub)
    code, out = dgx_stage(tmp_path, "stage", "-i", inventory, *POLL)
    assert code == 0, out

    # Progress: plain lines (stdout is a pipe), several of them for the paced main repo before it is done.
    assert "\x1b[" not in out
    main_lines = [line for line in out.splitlines() if line.startswith("[dgx1] stage %s: " % MAIN_REPO)]
    assert len(main_lines) >= 3 and len(set(main_lines)) == len(main_lines), out
    assert "done" in main_lines[-1] and not any("done" in line for line in main_lines[:-1]), main_lines
    # Every line came from a runner event: the retries of the stage pass's mirror_job poll, two or more of them
    # (the verify pass after it starts its own count; on a slow machine its polls are seen too).
    record = run_records(tmp_path)[-1]
    retries = [e for e in job_events(record) if e["event"] == "runner_retry"
               and e["event_data"].get("task_action") == "mirror_job"
               and e["event_data"]["res"]["progress"].get("repo_id") == MAIN_REPO
               and e["event_data"]["res"]["progress"].get("pass") == "stage"]
    assert len(retries) >= 2, len(retries)
    done = [e["event_data"]["res"]["progress"]["bytes_done"] for e in retries]
    assert done == sorted(done) and done[-1] > done[0], done

    # The table: the figures of this run's host report file.
    assert record["status"] == "ok" and record["exit_code"] == 0 and record["subcommand"] == "stage"
    history = record["reports"]["dgx1"]
    assert history == os.path.join(str(tmp_path / "reports"), "dgx1-%s.json" % record["run_id"])
    with open(history) as handle:
        report = json.load(handle)
    row = plain_row(out, "dgx1")
    assert row == expected_row(report), (row, out)
    local = sum(r["files"]["local"] for r in report["passes"]["stage"])
    excluded = sum(r["files"]["excluded"] for r in report["passes"]["stage"])
    assert row[2] == "ok" and row[3] == "%d/%d" % (local, excluded) and excluded == 5
    assert row[4] == table.human_bytes(report["bytes_from_nas"]) and report["bytes_from_nas"] >= 4 * PACED_SHARD
    assert row[5] == "0" and row[6] == "0" and row[8] == "sample"
    assert "artifacts: %s" % record["artifacts"] in out and os.path.isfile(record["log"])

    # `report RUN_ID --markdown` reproduces the figures from the stored reports.
    code, md = dgx_stage(tmp_path, "report", record["run_id"], "--markdown")
    assert code == 0, md
    assert markdown_row(md, "dgx1") == row
    assert md.startswith("### dgx-stage run %s (stage, " % record["run_id"]) and "| HOST | RUN | STATUS |" in md
    # One id for the run: the runner's dir, the run record and the lane's host reports; the latest run is the default.
    assert record["ident"] == record["run_id"] == os.path.basename(record["artifacts"])
    assert set(re.findall(r"\d{8}T\d{6}Z-[0-9a-f]{4}", out)) == {record["run_id"]}, out
    assert markdown_row(dgx_stage(tmp_path, "report", "--markdown")[1], "dgx1") == row


def test_a_host_failing_preflight_exits_2_naming_it_and_the_lane_stops_with_it(tmp_path, nas_hub):
    # Preflight is lane-wide: rank1's bad NAS root fails rank1 and, at the lane check, rank0 (nothing written).
    inventory, roots = lane(tmp_path, nas_hub, hosts=("rank0", "rank1"))
    with open(inventory) as handle:
        data = json.load(handle)
    data["all"]["children"]["exl3_2x"]["hosts"]["rank1"]["hub_nas_root"] = str(tmp_path / "no-such-nas")
    with open(inventory, "w") as handle:
        json.dump(data, handle)
    for root in roots.values():
        root.mkdir(parents=True)
    code, out = dgx_stage(tmp_path, "stage", "-i", inventory)
    assert code == 2, out
    failed = [line for line in out.splitlines() if line.startswith("host rank1 failed in play ")]
    assert len(failed) == 1, out
    assert "task " in failed[0] and "no-such-nas" in failed[0], failed
    lane_stop = [line for line in out.splitlines() if line.startswith("host rank0 failed in play preflight")]
    assert len(lane_stop) == 1 and "Preflight did not pass on rank1" in lane_stop[0], out
    record = run_records(tmp_path)[-1]
    assert record["exit_code"] == 2 and sorted(f["host"] for f in record["failures"]) == ["rank0", "rank1"]
    assert plain_row(out, "rank0")[2] == "failed" and plain_row(out, "rank1")[2] == "failed"
    # The stored run says the same, with the failures under the table.
    code, md = dgx_stage(tmp_path, "report", "--markdown")
    assert code == 0 and markdown_row(md, "rank1")[2] == "failed" and "- host rank1 failed in play" in md, md
    assert "- host rank0 failed in play preflight" in md, md


def test_ctrl_c_mid_copy_exits_99_and_the_reports_say_interrupted(tmp_path, make_nas_hub, kill_at_teardown):
    nas, inventory, roots = paced_lane(tmp_path, make_nas_hub)
    out_path = tmp_path / "frontend.out"
    with open(str(out_path), "wb") as out:
        proc = subprocess.Popen(frontend_command("stage", "-i", inventory, *POLL), cwd=REPO_ROOT,
                                env=frontend_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            text = out_path.read_text(errors="replace")
            if re.search(r"\[dgx1\] stage %s: .*\(\d+%%\)" % re.escape(MAIN_REPO), text) and "done" not in text:
                break
            time.sleep(0.2)
        assert proc.poll() is None, out_path.read_text()
        # ansible-playbook and its workers run in sessions of their own, the stage job daemonized.
        kill_at_teardown(proc, environ=own_environ(tmp_path))
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            processes.kill_tree(proc)
    out = out_path.read_text(errors="replace")
    assert code == 99, out
    assert "SIGINT forwarded to ansible-playbook" in out and "interrupted: exit 99" in out, out
    record = run_records(tmp_path)[-1]
    assert record["status"] == "interrupted" and record["exit_code"] == 99
    # The host's reports say what happened, not `running` for ever.
    for name in ("dgx1.json", "dgx1-%s.json" % record["run_id"]):
        with open(str(tmp_path / "reports" / name)) as handle:
            assert json.load(handle)["status"] == "interrupted", name
    code, shown = dgx_stage(tmp_path, "report", "--runs-dir", str(tmp_path / "runs"))
    assert code == 0 and "interrupted" in shown and "running" not in shown, shown


def test_a_run_waiting_for_another_on_the_same_repo_says_whom_and_shows_only_its_own_progress(tmp_path, nas_hub,
                                                                                            kill_at_teardown):
    inventory, roots = lane(tmp_path, nas_hub, hosts=("dgx1",))
    hub = roots["dgx1"]
    hub.mkdir(parents=True)
    folder = "models--" + MAIN_REPO.replace("/", "--")
    # Another run holds the repo, as every dgx-stage run does, and keeps writing its figures.
    holder = RepoLock(LocalTree(str(hub)), ".locks/" + folder, 0, run_id="20261201T101648Z-d3b7").__enter__()
    progress_file = hub / ".locks" / folder / "dgx-stage.progress.json"

    def others_figures():
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        figures = {"pass": "stage", "repo_id": MAIN_REPO, "pid": 1, "started_at": now, "updated_at": now,
                   "bytes_done": 999 * MIB, "bytes_total": 1000 * MIB, "files_done": 1, "files_total": 2,
                   "status": "running", "finished": False, "aborted": False}
        progress_file.write_text(json.dumps(dict(figures, passes={"stage": figures})))

    out_path = tmp_path / "frontend.out"
    waiting = re.compile(r"\[dgx1\] stage %s: waiting for another dgx-stage run on this repo to finish: "
                         r"run 20261201T101648Z-d3b7 \(pid %d, since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)"
                         % (re.escape(MAIN_REPO), os.getpid()))
    with open(str(out_path), "wb") as out:
        proc = subprocess.Popen(frontend_command("stage", "-i", inventory, *POLL), cwd=REPO_ROOT,
                                env=frontend_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        kill_at_teardown(proc, environ=own_environ(tmp_path))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not waiting.search(out_path.read_text()):
            others_figures()
            time.sleep(0.2)
        assert waiting.search(out_path.read_text()), out_path.read_text()
    finally:
        holder.__exit__(None, None, None)
    code = proc.wait(timeout=240)
    out = out_path.read_text(errors="replace")
    assert code == 0, out
    assert "of 1000.0 MiB" not in out, out            # the other run's figures were never shown as this run's
    assert run_records(tmp_path)[-1]["status"] == "ok"


def test_status_renders_each_hosts_lines_once(staged_hub):
    # A two-host lane staged by a good run (conftest.staged_hub: once a session, restored for this test).
    lane = staged_hub("rank0-rank1", staged_rank0_rank1)
    tmp_path, inventory = lane["dir"], lane["inventory"]
    code, out = dgx_stage(tmp_path, "status", "-i", inventory)
    assert code == 0, out
    record = run_records(tmp_path)[-1]
    lines = {}
    for event in job_events(record):
        data = event["event_data"]
        if event["event"] == "runner_on_ok" and data.get("task_action") == "stage_status":
            lines[data["host"]] = data["res"]["lines"]
    assert sorted(lines) == ["rank0", "rank1"]
    # Each host once, its lines under it, in order, each once.
    sections = re.split(r"^(rank[01]) \(rank [01]\):$", out, flags=re.M)
    assert sections.count("rank0") == 1 and sections.count("rank1") == 1, out
    for host, host_lines in lines.items():
        shown = sections[sections.index(host) + 1].strip("\n").splitlines()[:len(host_lines)]
        assert host_lines and shown == ["  " + line for line in host_lines], (host, out)
    assert MAIN_REPO in out and DRAFTER_REPO in out


def test_a_secret_in_the_operators_environment_is_in_no_file_of_the_run_dir(tmp_path):
    # ansible-runner records the environment it starts ansible-playbook with (the operator's whole one) in its
    # `command` artifact; the run dir is kept. A status run against a host list is the shortest real run.
    secret = "hf_%s" % os.urandom(12).hex()
    env = dict(frontend_env(tmp_path), HF_TOKEN=secret)
    proc = subprocess.run(frontend_command("status", "-i", "localhost,"), cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    record = run_records(tmp_path)[-1]
    assert record["status"] in ("ok", "failed"), proc.stdout.decode("utf-8", "replace")
    with open(os.path.join(record["artifacts"], "command")) as handle:
        assert sorted(json.load(handle)) == ["command", "cwd"]
    holding = []
    for folder, _dirs, names in os.walk(str(tmp_path / "runs")):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                if secret.encode() in handle.read():
                    holding.append(os.path.join(folder, name))
    assert holding == []   # the paths only: the secret is never printed
