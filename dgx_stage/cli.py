"""`dgx-stage`: the operator's command line for the dgx-stage playbooks (SUBCOMMANDS), on ansible-runner, and
`dgx-stage report [RUN_ID] [--markdown]`, which runs no playbook. Exit codes: see dgx_stage.EXIT_*."""
import argparse
import functools
import os
import re
import sys

from dgx_stage import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, REPO, SUBCOMMANDS, UsageError, extravars, runs, table


class Parser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            # Options are named, anything else not: it may be the value given to a misspelt -e.
            named = [a.split("=", 1)[0] if a.startswith("--") else a[:2] for a in unknown if a.startswith("-")]
            hidden = len(unknown) - len(named)
            self.error("unrecognized arguments: %s" % " ".join(
                named + (["(and %d more, not shown: they may hold a secret)" % hidden] if hidden else [])))
        return parsed

    def error(self, message):
        raise UsageError("%s\n%s" % (without_arguments(message), self.format_usage().strip()))


# argparse's messages that quote what was given, and how they read without it: a value given to an option the
# parser does not know there (an -e before the command) is read as the command, and may be a token.
NOT_SHOWN = "what was given is not shown: it may hold a secret"
QUOTING = (
    (re.compile(r"^argument COMMAND: invalid choice: .*\(choose from (?P<choices>[^()]*)\)$", re.S),
     "argument COMMAND: not a command (%s); the commands: {choices}; options such as -e go after the "
     "command" % NOT_SHOWN),
    (re.compile(r"^(?P<argument>argument [^:]+): invalid choice: .*\(choose from (?P<choices>[^()]*)\)$", re.S),
     "{argument}: not one of its choices (%s); choose from {choices}" % NOT_SHOWN),
    (re.compile(r"^(?P<argument>argument [^:]+): invalid (?P<type>\w+) value: .*$", re.S),
     "{argument}: not a valid {type} value (%s)" % NOT_SHOWN),
    (re.compile(r"^(?P<argument>argument [^:]+): ignored explicit argument .*$", re.S),
     "{argument}: takes no value (%s)" % NOT_SHOWN),
    (re.compile(r"^ambiguous option: .* could match (?P<choices>[^ ]+(, [^ ]+)*)$", re.S),
     "ambiguous option (%s): it could be {choices}" % NOT_SHOWN),
)


def without_arguments(message):
    """argparse's `message` without the argument it quotes (QUOTING)."""
    for pattern, said in QUOTING:
        found = pattern.match(message)
        if found:
            return said.format(**dict(found.groupdict(), choices=(found.groupdict().get("choices") or "")
                                      .replace("'", "")))
    return message


def runs_dir(args):
    return os.path.abspath(args.runs_dir or os.environ.get("DGX_STAGE_RUNS_DIR")
                           or os.path.join(REPO, ".cache", "runs"))


def build_parser():
    # allow_abbrev=False: a prefix (`--extra`) is refused, not read as --extra-vars.
    strict = functools.partial(Parser, allow_abbrev=False)
    parser = strict(prog="dgx-stage", description="Stage, verify and serve the DeepSeek checkpoints on the lane "
                                                  "(the playbooks of this repo, run through ansible-runner).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=strict)
    sub.required = True
    for name, (playbook, tags, help_text) in SUBCOMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description="%s: runs %s%s" % (
            help_text, playbook, " --tags " + tags if tags else ""))
        cmd.add_argument("-i", "--inventory", help="inventory path (default: $DGX_STAGE_INVENTORY; one of them is required)")
        cmd.add_argument("--limit", help="only these hosts (an Ansible host pattern)")
        cmd.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VAR=VALUE|@FILE",
                         help="extra variables, as ansible-playbook -e (repeatable); each must be a variable the "
                              "plays or roles read, or one the inventory defines")
        cmd.add_argument("--allow-unknown-vars", action="store_true",
                         help="accept -e variables no play or role reads (a site's own extensions)")
        cmd.add_argument("--check", action="store_true", help="dry run: --check --diff, nothing changes")
        cmd.add_argument("-v", "--verbose", action="count", default=0,
                         help="also stream the playbook's output (-vv and up: ansible-playbook -v...)")
        if tags and ("stage" in tags.split(",") or "verify" in tags.split(",")):
            cmd.add_argument("--live", action="store_true",
                             help="beside a serving engine: reads capped at the inventory's stage_live_max_mib_s, "
                                  "in the stage_live_io_priority I/O class (-e stage_live=true)")
    report = sub.add_parser("report", help="render the stored host reports of a run",
                            description="Render the host reports of a recorded run (default: the latest) as the "
                                        "final table, or as Markdown for a change log.")
    report.add_argument("run_id", nargs="?", metavar="RUN_ID", help="a run's id (shown when it starts and in its table)")
    report.add_argument("--markdown", action="store_true", help="a Markdown table")
    for cmd in sub.choices.values():
        cmd.add_argument("--runs-dir", help="where runs are recorded (default: $DGX_STAGE_RUNS_DIR, else .cache/runs "
                                            "of the repo)")
    report.add_argument("--report-dir", help="read the reports here (default: the dir the run wrote them to)")
    report.add_argument("--limit", help="only these hosts (an Ansible host pattern over the run's hosts)")
    return parser


def resolve_inventory(path):
    """-i, else $DGX_STAGE_INVENTORY, made absolute (none implicit: a forgotten -i must not reach production)."""
    path = path or os.environ.get("DGX_STAGE_INVENTORY")
    if not path:
        folder = os.path.join(REPO, "inventory")
        raise UsageError("no inventory: pass -i INVENTORY or set DGX_STAGE_INVENTORY (this repo has: %s)" % ", ".join(
            sorted(os.path.join("inventory", name) for name in os.listdir(folder)
                   if os.path.isdir(os.path.join(folder, name)))))
    if "," in path and not os.path.exists(path):
        return path
    if not os.path.exists(path):
        raise UsageError("inventory not found: %s" % path)
    return os.path.abspath(path)


def resolve_limit(limit):
    """--limit with an @file made absolute, as ansible-playbook runs in the repo."""
    if not limit or not limit.startswith("@"):
        return limit
    if not os.path.isfile(limit[1:]):
        raise UsageError("--limit file not found: %s" % limit[1:])
    return "@" + os.path.abspath(limit[1:])


def load_inventory(path, limit=None):
    """The Inventory; UsageError when it or --limit gives no host (ansible-playbook would run on none, exit 0)."""
    inventory = extravars.Inventory(path)
    if not inventory.hosts():
        raise UsageError("inventory %s has no host (%s); fix it or pass another with -i"
                         % (path, " ".join(inventory.warnings[:3]) or "it is empty"))
    if limit and not inventory.hosts(limit):
        raise UsageError("--limit %s matches no host of %s (hosts: %s)"
                         % (limit, path, ", ".join(inventory.hosts())))
    return inventory


def run_subcommand(args, out=None):
    from dgx_stage.run import PlaybookRun
    playbook, tags, _help = SUBCOMMANDS[args.command]
    inventory = resolve_inventory(args.inventory)
    extra_vars = extravars.resolve(args.extra_vars) + (["stage_live=true"] if getattr(args, "live", False) else [])
    args.limit = resolve_limit(args.limit)
    extravars.check(extra_vars, load_inventory(inventory, args.limit), allow_unknown=args.allow_unknown_vars)
    spec = {"subcommand": args.command, "playbook": playbook, "tags": tags,
            "inventory": inventory, "limit": args.limit, "extra_vars": extra_vars, "check": args.check,
            "verbose": args.verbose}
    return PlaybookRun(spec, runs_dir(args), out=out).run()


def _limit_hosts(hosts, limit):
    """The hosts of a run --limit selects, read as a playbook's --limit (its hosts as the inventory)."""
    hosts = sorted(set(hosts))
    return extravars.Inventory(",".join(hosts) + ",").hosts(resolve_limit(limit)) if limit and hosts else hosts


def load_run_reports(args):
    """(record or {}, run id, {host: report}) of the run asked for, else the latest that could change the lane."""
    import json
    folder = runs_dir(args)
    records = runs.read_records(folder)
    history = runs.history_files(args.report_dir) if args.report_dir else {}
    changes = [r for r in records if r["subcommand"] != "status"]
    if args.run_id:
        record = ([r for r in records if args.run_id in (r["ident"], r["run_id"])] or [{}])[-1]
        run_id = record.get("run_id") if record else (args.run_id if args.run_id in history else None)
        if record.get("subcommand") == "status" and not run_id:
            raise UsageError("run %s wrote no host reports (a status run)" % args.run_id)
        if not record and not run_id:
            known = set([r["ident"] for r in records] + [r["run_id"] for r in records if r["run_id"]] + list(history))
            raise UsageError("unknown run %s; known runs: %s" % (args.run_id, ", ".join(sorted(known)) or "none"))
    elif changes or history:
        record = changes[-1] if changes else {}
        run_id = record.get("run_id") if changes else max(history)
    else:
        elsewhere = runs.runs_dirs_nearby(REPO, folder)
        raise UsageError("no recorded run under %s; point at another runs dir with --runs-dir DIR or "
                         "DGX_STAGE_RUNS_DIR%s" % (folder, " (runs are recorded under: %s)" % ", ".join(
                             os.path.relpath(p, os.getcwd()) for p in elsewhere) if elsewhere else ""))
    paths = dict(record.get("reports") or {}) if run_id else {}
    if run_id and args.report_dir:
        paths = dict((host, os.path.join(args.report_dir, "%s-%s.json" % (host, run_id))) for host in paths)
        paths.update(history.get(run_id) or {})
    reports = {}
    for host in _limit_hosts(paths, args.limit):
        try:
            with open(paths[host]) as handle:
                reports[host] = json.load(handle)
            if not isinstance(reports[host], dict):
                raise ValueError("%s is not a JSON object" % paths[host])
        except (OSError, ValueError) as exc:
            reports[host] = {"host": host, "run_id": run_id, "status": "unreadable: %s" % exc}
        if record.get("status") == "interrupted" and reports[host].get("status") == "running":
            reports[host]["status"] = "interrupted"      # the front end died before it settled them
    if args.limit and not reports and paths:
        raise UsageError("--limit %s matches no host of run %s (hosts: %s)"
                         % (args.limit, run_id, ", ".join(sorted(paths))))
    return record, run_id, reports


def report_subcommand(args, out=None):
    out = out or sys.stdout
    record, run_id, reports = load_run_reports(args)
    rows = table.table_rows(reports, record.get("receipts_removed") or {})
    known = [record[key] for key in ("subcommand", "started", "status") if record.get(key)]
    title = "dgx-stage run %s" % (run_id or record["ident"]) + (" (%s)" % ", ".join(known) if known else "") + (
        "" if reports else ": no host report was written")
    # A host that failed before any report of it was written is only in run.json's failures.
    unreported = [f for f in record.get("failures") or [] if f["host"] not in reports]
    shown = _limit_hosts([f["host"] for f in unreported], args.limit)
    failures = [{"host": h, "play": r.get("failed_play"), "task": r.get("failed_task"), "msg": r.get("failed_msg")}
                for h, r in sorted(reports.items()) if r.get("status") == "failed"] + [
        f for f in unreported if f["host"] in shown]
    inventory = record.get("inventory")
    # Why the front end itself stopped the run, when it did (run.json's error): the table alone would not say.
    error = [str(record["error"])] if record.get("error") else []
    if args.markdown:
        out.write(table.render_markdown(rows, title=title, failures=failures, inventory=inventory) + "\n")
        for line in error:
            out.write("\n%s\n" % table.markdown_escape(line))
        return EXIT_OK
    from dgx_stage.display import Display
    display = Display(out)
    if reports:
        display.table(rows, title)
    else:
        display.print(title)
    for line in [table.failure_line(failure, inventory) for failure in failures] + error:
        display.print(line)
    return EXIT_OK


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        if args.command == "report":
            return report_subcommand(args)
        return run_subcommand(args)
    except UsageError as exc:
        sys.stderr.write("dgx-stage: %s\n" % exc)
        return EXIT_USAGE
    except KeyboardInterrupt:   # before a run started (reading the inventory): nothing ran
        sys.stderr.write("dgx-stage: interrupted before any playbook ran\n")
        return EXIT_INTERRUPTED
