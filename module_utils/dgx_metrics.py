"""The node_exporter textfile `<stage_metrics_dir>/dgx_stage.prom` (module stage_metrics), rendered from the host's
latest report view; its first line names the host, so a directory shared between hosts is refused.
"""
import math
import os
import re

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_fsutil import TEMP_PREFIX, atomic_write_bytes, is_temp_name, read_small, unlink_quietly
from ansible.module_utils.dgx_process import process_alive
from ansible.module_utils.dgx_units import utc_epoch

FILE_NAME = "dgx_stage.prom"
PREVIOUS_MAX_BYTES = 1024 * 1024
MAX_TIMESTAMP = 95617584000.0     # 5000-01-01T00:00:00Z
HOST_COMMENT = "# dgx-stage textfile of host "

# name -> help, in the order they are written.
METRICS = (
    ("dgx_stage_last_run_success", "1 when the last dgx-stage run on this host ended ok, 0 when it failed."),
    ("dgx_stage_last_success_timestamp_seconds", "When the last successful dgx-stage run on this host ended."),
    ("dgx_stage_repo_staged_bytes", "Bytes of the repo's selected files staged on the local disk, by commit."),
    ("dgx_stage_last_verify_timestamp_seconds", "When the repo's local copy was last proven by a verify pass."),
    ("dgx_stage_blobs_repaired", "Local blobs repaired (replaced after a failed check) by the last stage and verify passes."),
    ("dgx_stage_nas_corrupt_blobs", "Snapshot files whose NAS blob does not hash to its name, found by the last stage and verify passes."),
    ("dgx_stage_decode_tokens_per_second", "Decode tokens per second of the last decode probe on this host."),
)
TIMESTAMP_METRICS = ("dgx_stage_last_success_timestamp_seconds", "dgx_stage_last_verify_timestamp_seconds")

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def escape_label(value):
    """A label value for the text format: \\ as \\\\, " as \\", newline as \\n."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def unescape_label(text):
    return re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], text)


def format_value(value):
    """A sample value: integers without a fraction, floats as repr."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


def parse_samples(text):
    """[(name, {label: value}, float)] of a textfile; comments and unreadable lines are skipped."""
    samples = []
    for line in (text or "").splitlines():
        match = _SAMPLE.match(line.strip())     # no comment or blank line matches
        if not match:
            continue
        name, labels_text, value = match.groups()
        labels = dict((k, unescape_label(v)) for k, v in _LABEL.findall(labels_text or ""))
        try:
            samples.append((name, labels, float(value)))
        except ValueError:
            continue
    return samples


def previous_state(text):
    """{"last_success": seconds or None, "last_verify": {repo: (mode, seconds)}} of the previous file: only
    samples this module writes (its labels, a plausible value), so garbage never becomes the last success."""
    state = {"last_success": None, "last_verify": {}}
    for name, labels, value in parse_samples(text):
        if not (math.isfinite(value) and 0 < value < MAX_TIMESTAMP):
            continue
        if name == "dgx_stage_last_success_timestamp_seconds" and not labels:
            state["last_success"] = value
        elif (name == "dgx_stage_last_verify_timestamp_seconds" and labels.get("repo")
              and set(labels) <= {"repo", "mode"}):
            state["last_verify"][labels["repo"]] = (labels.get("mode") or "unknown", value)
    return state


def _rows(report, name):
    rows = (report.get("passes") or {}).get(name) if isinstance(report.get("passes"), dict) else None
    return [r for r in rows or [] if isinstance(r, dict) and r.get("repo_id")]


def _play_finished(report, name):
    plays = report.get("plays") if isinstance(report.get("plays"), dict) else {}
    record = plays.get(name) if isinstance(plays.get(name), dict) else {}
    return record.get("finished") or ""


def run_outcome(report):
    """(status, finished) of the last real (not --check) run of the view."""
    if report.get("check_mode"):
        last = report.get("last_real_run") if isinstance(report.get("last_real_run"), dict) else {}
        return last.get("status"), last.get("finished")
    return report.get("status"), report.get("finished")


def _int(value):
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def samples_of(report, previous):
    """[(name, labels, value)] for the textfile, from a latest report view and previous_state()."""
    samples = []
    status, finished = run_outcome(report)
    if status in ("ok", "failed"):
        samples.append(("dgx_stage_last_run_success", {}, 1 if status == "ok" else 0))
    last_success = utc_epoch(finished) if status == "ok" else None
    if last_success is None:
        last_success = previous["last_success"]
    if last_success is not None:
        samples.append(("dgx_stage_last_success_timestamp_seconds", {}, last_success))

    # Staged bytes and commit: the repo's row of the later of the last stage and verify passes that ended ok.
    staged = {}
    passes = sorted(("stage", "verify"), key=lambda name: _play_finished(report, name))
    for name in passes:
        for row in _rows(report, name):
            if row.get("status") == "ok" and row.get("commit"):
                staged[(row["repo_id"], row.get("repo_type") or "model")] = row
    for (repo, repo_type), row in sorted(staged.items()):
        samples.append(("dgx_stage_repo_staged_bytes", {"repo": repo, "repo_type": repo_type, "commit": row["commit"]},
                        _int(row.get("bytes_staged"))))

    verified = utc_epoch(_play_finished(report, "verify"))
    verify_rows = dict((row["repo_id"], row) for row in _rows(report, "verify"))
    # A previous sample is kept for a repo the view still stages; one dropped from stage_repos ends its series
    # (no stale-verify alert forever). A view without stage or verify rows says nothing: keep them all.
    known = set(verify_rows) | set(row["repo_id"] for row in _rows(report, "stage"))
    kept = set(previous["last_verify"]) & known if known else set(previous["last_verify"])
    repos = sorted(set(verify_rows) | kept)
    for repo in repos:
        row = verify_rows.get(repo)
        if row is not None and row.get("status") == "ok" and verified is not None:
            samples.append(("dgx_stage_last_verify_timestamp_seconds",
                            {"repo": repo, "mode": row.get("verify") or "unknown"}, verified))
        elif repo in previous["last_verify"]:
            mode, seconds = previous["last_verify"][repo]
            samples.append(("dgx_stage_last_verify_timestamp_seconds", {"repo": repo, "mode": mode}, seconds))

    rows = _rows(report, "stage") + _rows(report, "verify")
    if rows:
        samples.append(("dgx_stage_blobs_repaired", {},
                        sum(_int((r.get("blobs") or {}).get("repaired")) for r in rows
                            if isinstance(r.get("blobs"), dict))))
        samples.append(("dgx_stage_nas_corrupt_blobs", {},
                        sum(len(set(r.get("nas_corrupt") or [])) for r in rows if isinstance(r.get("nas_corrupt"), list))))

    decode = (report.get("engine") or {}).get("decode") if isinstance(report.get("engine"), dict) else None
    rate = decode.get("decode_tok_s") if isinstance(decode, dict) else None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        samples.append(("dgx_stage_decode_tokens_per_second", {}, rate))
    return samples


def render(samples, host=None):
    """The textfile: the host comment, then per metric HELP, TYPE gauge and its samples."""
    lines = [HOST_COMMENT + escape_label(host)] if host else []
    for name, help_text in METRICS:
        mine = [s for s in samples if s[0] == name]
        if not mine:
            continue
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s gauge" % name)
        for _name, labels, value in mine:
            label_text = ",".join('%s="%s"' % (k, escape_label(v)) for k, v in sorted(labels.items()))
            lines.append("%s%s %s" % (name, "{%s}" % label_text if label_text else "", format_value(value)))
    return "\n".join(lines) + "\n"


def previous_host(text):
    """The host a previous textfile names (render's comment), or None."""
    for line in (text or "").splitlines():
        if line.startswith(HOST_COMMENT):
            return unescape_label(line[len(HOST_COMMENT):])
    return None


def content_change(old, new):
    """none (identical), timestamps (only the timestamp samples' values differ) or content."""
    if old == new:
        return "none"
    if old is None:
        return "content"

    def masked(text):     # a timestamp sample without its value: its name and labels
        return [line.rsplit(" ", 1)[0] if line.startswith(TIMESTAMP_METRICS) else line for line in text.splitlines()]

    return "timestamps" if masked(old) == masked(new) else "content"


def open_metrics_dir(directory):
    """An fd of the metrics directory (a symlink to one is followed: node_exporter setups use them)."""
    if not directory or not os.path.isabs(directory):
        raise StageError("stage_metrics_dir %r is not an absolute path: set it to node_exporter's "
                         "--collector.textfile.directory, or leave it unset for no metrics" % (directory,))
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StageError("stage_metrics_dir %s is not an existing directory (%s): create it (node_exporter's "
                         "--collector.textfile.directory) or leave stage_metrics_dir unset"
                         % (directory, exc.strerror or exc))
    if not os.access(directory, os.W_OK | os.X_OK):
        os.close(fd)
        raise StageError("stage_metrics_dir %s is not writable by this user (uid %d): make it writable, "
                         "or run with become" % (directory, os.geteuid()))
    return fd


def dead_temp_files(dir_fd):
    """This textfile's temp files whose writing process is gone (a killed run's); never another exporter's."""
    head = TEMP_PREFIX + FILE_NAME + "."
    found = []
    for name in os.listdir(dir_fd):
        if name.startswith(head) and is_temp_name(name):
            pid = name[len(head):].split(".")[0]
            if pid.isdigit() and not process_alive(int(pid)):
                found.append(name)
    return sorted(found)


def write_metrics(directory, report, write=True):
    """Render the textfile from `report` and the previous file; write it atomically (0644) when it differs."""
    fd = open_metrics_dir(directory)
    try:
        path = os.path.join(directory, FILE_NAME)
        if os.path.isdir(path) and not os.path.islink(path):    # rename() cannot replace a directory
            raise StageError("%s in stage_metrics_dir %s is a directory, not the textfile: remove it (dgx-stage "
                             "writes the file itself)" % (FILE_NAME, directory))
        raw = read_small(FILE_NAME, PREVIOUS_MAX_BYTES, fd)      # never through a link
        previous = None if raw is None else raw.decode("utf-8", "replace")
        host = report.get("host") if isinstance(report.get("host"), str) else None
        other = previous_host(previous)
        if host and other and other != host:
            raise StageError("%s in stage_metrics_dir %s is the textfile of host %s, not %s: stage_metrics_dir must "
                             "be this node's own directory (node_exporter's --collector.textfile.directory on "
                             "its local disk), not one shared between hosts. If %s was renamed to %s, remove the "
                             "file." % (FILE_NAME, directory, other, host, other, host))
        content = render(samples_of(report, previous_state(previous)), host)
        change = content_change(previous, content)
        debris = dead_temp_files(fd)
        written = write and change != "none"
        for name in debris if write else []:
            unlink_quietly(name, dir_fd=fd)
        try:
            if written:
                atomic_write_bytes(FILE_NAME, content.encode("utf-8"), mode=0o644, dir_fd=fd)
        except OSError as exc:
            raise StageError("cannot write %s in stage_metrics_dir %s: %s" % (FILE_NAME, directory, exc))
    finally:
        os.close(fd)
    return {"path": path, "content": content, "previous": previous,
            "change": change, "written": written, "debris": debris}
