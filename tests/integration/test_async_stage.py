"""The stage and verify passes run each repo as a background job (async, poll 0) watched by mirror_job polls
(roles/stage/tasks/mirror-async.yml): through ansible-playbook on localhost, the polls' progress grows while a
paced copy runs (read from ansible-runner's retry events), the mirror's own failure still fails the host with
its message, the jobs dir keeps everything but the files of ended jobs, a symlinked jobs dir is refused before
anything is written, a re-run changes nothing, and a job whose lease is not renewed (its controller is gone)
stops itself cleanly."""
import json
import os
import subprocess
import signal
import threading
import time

import ansible_runner

from ansible.module_utils.dgx_fsutil import is_temp_name, walk_tree
from conftest import (REPO_ROOT, ansible_env, failures, module_command, own_environ, parse_module_output,
                      run_playbook)
from hubgen import DRAFTER_REPO, MAIN_REPO
from test_stage_playbook import localhost_tasks, mirror_results, play
from test_verify_and_progress import failed_on_a_corrupt_nas_shard, lane, paced_python, to_copy

MIB = 1024 * 1024
STAGE = "preflight,stage"
JOBS = os.path.join(".locks", "dgx-stage-async")
RESULT_TASK = "Mirror | Each repo from the NAS hub to the local hub, pass %s"


def job_files(hub):
    jobs = os.path.join(str(hub), JOBS)
    return sorted(name for name in os.listdir(jobs) if name.startswith("j")) if os.path.isdir(jobs) else []


def runner_events(tmp_path, inventory, tags):
    """(status, rc, events) of stage-deepseek.yml run through ansible_runner, as a front end runs it."""
    events = []
    (tmp_path / "runner").mkdir()
    env = ansible_env(tmp_path)
    env.pop("ANSIBLE_STDOUT_CALLBACK")          # ansible-runner brings its own
    run = ansible_runner.run(private_data_dir=str(tmp_path / "runner"), project_dir=REPO_ROOT,
                             playbook="stage-deepseek.yml", inventory=inventory, cmdline="--tags %s" % tags,
                             envvars=env, quiet=True, event_handler=lambda event: events.append(event) or True)
    return run.status, run.rc, events


def test_polls_report_growing_progress_of_a_slow_copy(tmp_path, make_nas_hub):
    nas = make_nas_hub(shard_size=24 * MIB, n_shards=4)
    files, nbytes = to_copy(nas)
    inventory, roots = lane(tmp_path, nas, interpreter=paced_python(tmp_path, delay=0.2), stage_workers=2,
                            stage_poll_interval=0.5)
    status, rc, events = runner_events(tmp_path, inventory, STAGE)
    assert (status, rc) == ("successful", 0), [e.get("stdout") for e in events][-30:]
    polls = [e["event_data"]["res"] for e in events if e["event"] == "runner_retry"
             and e["event_data"]["res"].get("progress", {}).get("repo_id") == MAIN_REPO]
    assert len(polls) >= 2, [p.get("line") for p in polls]
    for res in polls:
        assert res["finished"] is False and res["progress"]["pass"] == "stage"
        assert res["line"].startswith("stage %s: " % MAIN_REPO)
    moving = [p["progress"] for p in polls if p["progress"]["updated_at"]]
    done = [p["bytes_done"] for p in moving]
    assert done == sorted(done) and len(set(done)) >= 2, done           # it grows, never back
    assert all(p["bytes_total"] == nbytes for p in moving if p["step"] == "copying")
    # The job's end: the last poll, then the result task with the mirror's own result and the full figures.
    ended = [e["event_data"]["res"] for e in events if e["event"] in ("runner_on_ok", "runner_item_on_ok")
             and e["event_data"].get("task_action", "").endswith("mirror_job")
             and e["event_data"]["res"].get("finished") is True
             and e["event_data"]["res"].get("progress", {}).get("repo_id") == MAIN_REPO]
    assert ended, "no finished poll or result of %s" % MAIN_REPO
    final = ended[-1]
    assert final["progress"]["bytes_done"] == final["progress"]["bytes_total"] == nbytes >= done[-1]
    assert final["progress"]["files_done"] == files and final["progress"]["finished"] is True
    assert final["report"]["status"] == "ok" and final["blobs"]["copied"] > 0 and final["changed"] is True
    assert job_files(roots["localhost"]) == []


def test_a_corrupt_nas_blob_fails_the_host_with_the_mirrors_message(staged_hub):
    # The run (--tags preflight,stage, a fresh node, the NAS's second main shard rotted): once a session.
    failed = failed_on_a_corrupt_nas_shard(staged_hub)
    tmp_path, nas_hub, roots = failed["dir"], failed["nas"], {"localhost": failed["dir"] / "localhost" / "hub"}
    shard = nas_hub["repos"][MAIN_REPO]["shards"][1]
    info = nas_hub["repos"][MAIN_REPO]["files"][shard]
    code, tasks = failed["code"], localhost_tasks(failed["data"])
    stats = failed["data"]["stats"].get("localhost", {})
    assert code != 0 and stats["failures"] == 1
    results = dict((r["item"]["repo_id"], r) for r in mirror_results(tasks, "stage"))
    failed = results[MAIN_REPO]
    assert failed["failed"] is True and shard in failed["msg"] and info["etag"] in failed["msg"]
    assert failed["nas_corrupt"] == [shard] and failed["progress"]["aborted"] is True
    assert results[DRAFTER_REPO]["report"]["status"] == "ok"      # every repo had its turn, as in the foreground
    report = json.loads((tmp_path / "reports" / "localhost.json").read_text())
    assert report["status"] == "failed"
    assert report["failed_task"].startswith(RESULT_TASK % "stage")
    assert shard in report["failed_msg"] and info["etag"] in report["failed_msg"]
    rows = dict((row["repo_id"], row) for row in report["passes"]["stage"])
    assert rows[MAIN_REPO]["status"] == "failed" and rows[MAIN_REPO]["nas_corrupt"] == [shard]
    assert job_files(roots["localhost"]) == []


def test_only_ended_jobs_files_are_removed_and_a_rerun_changes_nothing(tmp_path, nas_hub):
    inventory, roots = lane(tmp_path, nas_hub)
    jobs = roots["localhost"] / JOBS
    jobs.mkdir(parents=True)
    (jobs / "decoy.json").write_text('{"changed": true}')                    # not a job file: kept
    (jobs / "j100.200").write_text('{"changed": false, "msg": "an earlier run"}')   # an ended job: removed
    os.utime(str(jobs / "j100.200"), (time.time() - 86400 - 120,) * 2)     # once nobody can still collect it
    (jobs / "j100.201").write_text('{"changed": false, "msg": "a run at work"}')    # fresh: another run's: kept
    (jobs / "j300.400").write_text('{"started": true, "finished": false}')   # another run's job, running: kept
    code, data = run_playbook(tmp_path, inventory, "--tags", "preflight,stage,verify")
    assert code == 0, failures(data)
    assert sorted(os.listdir(str(jobs))) == ["decoy.json", "j100.201", "j300.400"]       # and none of this run's
    assert (jobs / "decoy.json").read_text() == '{"changed": true}'

    code, tasks, stats = play(tmp_path, inventory, tags="preflight,stage,verify")
    assert code == 0 and stats["changed"] == 0, stats
    for stage_pass in ("stage", "verify"):
        rows = mirror_results(tasks, stage_pass)
        assert [r["item"]["repo_id"] for r in rows] == [MAIN_REPO, DRAFTER_REPO]
        assert all(r["changed"] is False and r["report"]["status"] == "ok" for r in rows)
    assert sorted(os.listdir(str(jobs))) == ["decoy.json", "j100.201", "j300.400"]


def test_a_symlinked_jobs_dir_is_refused_before_anything_is_written(tmp_path, nas_hub):
    inventory, roots = lane(tmp_path, nas_hub)
    hub = roots["localhost"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (hub / ".locks").mkdir(parents=True)
    os.symlink(str(elsewhere), str(hub / JOBS))
    code, tasks, stats = play(tmp_path, inventory, tags=STAGE)
    assert code != 0 and stats["failures"] == 1
    refused = [run for name, runs in tasks.items() if name.startswith("Mirror | Ready the background jobs")
               for run in runs if run.get("failed")]
    assert len(refused) == 1, tasks.keys()
    msg = refused[0]["msg"]
    assert str(hub / JOBS) in msg and "symlink" in msg and "stage_async_dir" in msg
    assert os.listdir(str(elsewhere)) == []
    assert sorted(os.listdir(str(hub))) == [".locks"]                 # no repo was touched
    report = json.loads((tmp_path / "reports" / "localhost.json").read_text())
    assert report["failed_task"].startswith("Mirror | Ready the background jobs") and str(hub / JOBS) in \
        report["failed_msg"]


def test_a_job_whose_lease_is_not_renewed_stops_itself_cleanly(tmp_path, make_nas_hub):
    """No poll renews the lease (as when the controller was killed): the paced copy stops after about
    lease_timeout, through the interrupted path - no temp file, no ref, the lock released, the progress
    file saying interrupted - instead of running to its end."""
    nas = make_nas_hub(shard_size=24 * MIB, n_shards=4)
    local = tmp_path / "local"
    local.mkdir()
    lease = tmp_path / "dgx-lease.test"
    args = {"src": nas["hub"], "dest": str(local), "repo_id": MAIN_REPO, "ignore_patterns": ["page15/"],
            "workers": 2, "lease_file": str(lease), "lease_timeout": 1}
    cmd = [part if not part.startswith("ansible_python_interpreter=") else
           "ansible_python_interpreter=%s" % paced_python(tmp_path, delay=0.5) for part in module_command(args)]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)
    elapsed = time.monotonic() - started
    result = parse_module_output(proc.stdout.decode("utf-8", "replace"))
    assert result.get("failed") is True, result
    assert "interrupted" in result["msg"] and "was not renewed" in result["msg"] and str(lease) in result["msg"]
    folder = nas["repos"][MAIN_REPO]["folder"]
    assert [p for p, _rel, _d in walk_tree(str(local)) if is_temp_name(os.path.basename(p))] == []
    assert not os.path.exists(str(local / folder / "refs" / "main"))
    doc = json.loads((local / ".locks" / folder / "dgx-stage.progress.json").read_text())
    assert doc["status"] == "interrupted" and doc["aborted"] is True and doc["bytes_done"] < doc["bytes_total"]
    assert elapsed < 60, elapsed


def test_a_job_killed_with_its_async_wrapper_ends_the_wait_with_words_not_at_the_time_limit(tmp_path,
                                                                                             make_nas_hub,
                                                                                             kill_at_teardown):
    """kill -9 of the whole background job (the async wrapper's watcher and runner, and the module) leaves its
    job file saying running forever: the poll sees the job's process (named in its lease) gone and fails the
    host within seconds, saying what happened, instead of polling until stage_async_timeout (a day)."""
    nas = make_nas_hub(shard_size=8 * MIB, n_shards=3)
    inventory, roots = lane(tmp_path, nas, interpreter=paced_python(tmp_path, delay=0.3), stage_poll_interval=0.5)
    jobs = roots["localhost"] / JOBS
    ran = {}
    runner = threading.Thread(target=lambda: ran.update(result=run_playbook(tmp_path, inventory, "--tags", STAGE)))
    runner.start()
    try:
        deadline = time.monotonic() + 120
        leases = []
        while time.monotonic() < deadline and not leases:
            leases = [n for n in (os.listdir(str(jobs)) if jobs.is_dir() else []) if n.startswith("dgx-lease.")]
            time.sleep(0.1)
        assert leases, "no background job started"
        time.sleep(1)
        jid = job_files(roots["localhost"])[0].split(".")[0]
        ps = subprocess.check_output(["ps", "-eww", "-o", "pid=,args="]).decode("utf-8", "replace")
        tree = [int(line.split()[0]) for line in ps.splitlines() if "async_wrapper" in line and jid in line]
        tree.append(int((jobs / leases[0]).read_text().strip()))       # the module's own pid, from its lease
        kill_at_teardown(*tree, environ=own_environ(tmp_path))     # the job, and the run if it outlives the wait
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
    finally:
        runner.join(timeout=300)
    assert time.monotonic() - killed < 60
    code, data = ran["result"]
    assert code != 0
    msgs = [r.get("msg", "") for play_ in data["plays"] for task in play_["tasks"]
            if task["task"]["name"].endswith(RESULT_TASK % "stage")
            for res in task["hosts"].values() for r in res.get("results", [res])]
    assert any("is gone and its async wrapper wrote no result" in m and "Re-run to finish" in m for m in msgs), msgs
    assert job_files(roots["localhost"]) == []
