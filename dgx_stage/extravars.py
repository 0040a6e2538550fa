"""The operator's -e values: checked before a run, handed to ansible-playbook in files that only the run can
read and that are removed when it ends, and recorded by name only.

An inline value on ansible-playbook's command line would land in ansible-runner's `command` artifact, in
`ps` and in run.json; an -e value can be a token (engine_env), so the command line carries `-e @file`."""
import contextlib
import io
import json
import os

from dgx_stage import REPO, UsageError

OPTIONS = ("-e", "--extra-vars")


def _loader():
    os.environ["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    from ansible.parsing.dataloader import DataLoader
    return DataLoader()


def parsed(value, path=None):
    """The variables one -e value sets, as ansible-playbook reads it (ansible.utils.vars.load_extra_vars):
    @file or inline JSON/YAML through the data loader, anything else as key=value pairs; UsageError when it
    does not parse to a mapping."""
    if not path and not value.startswith(("{", "[")):
        from ansible.parsing.splitter import parse_kv
        return parse_kv(value)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            data = _loader().load_from_file(path) if path else _loader().load(value)
    except Exception as exc:   # Ansible's parse errors have no common base worth naming
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError("-e %s does not parse: %s" % (path or value, first))
    if not isinstance(data, dict) and data is not None:
        raise UsageError("-e %s is not a mapping of variables (a %s)"
                         % (path or value, "list" if isinstance(data, list) else type(data).__name__))
    return data or {}


def resolve(values):
    """-e values with @file made absolute; UsageError for a missing file, or a file or inline JSON/YAML
    that does not parse (ansible-playbook would stop with exit 1 and no host result)."""
    out = []
    for value in values:
        if value.startswith("@"):
            path = value[1:]
            if not os.path.isfile(path):
                raise UsageError("extra vars file not found: %s" % path)
            value = "@" + os.path.abspath(path)
            parsed(value, path)
        else:
            parsed(value)
        out.append(value)
    return out


def described(value):
    """How run.json records one -e value: a file by its path, an inline value by the names it sets."""
    if value.startswith("@"):
        return value
    names = sorted(str(name) for name in parsed(value))
    return "%s (values not recorded)" % ", ".join(names) if names else "(nothing set)"


def recorded_argv(argv):
    """The command line as run.json keeps it: each inline -e value replaced by what described() says."""
    out, follows = [], False
    for arg in argv:
        if follows:
            out.append(described(arg))
            follows = False
        elif arg in OPTIONS:
            out.append(arg)
            follows = True
        elif arg.startswith("--extra-vars="):
            out.append("--extra-vars=" + described(arg[len("--extra-vars="):]))
        elif arg.startswith("-e") and not arg.startswith("--"):
            out.append("-e" + described(arg[2:]))
        else:
            out.append(arg)
    return out


def as_files(values, directory):
    """The -e values as ansible-playbook gets them: each inline one written as JSON to a file of its own in
    `directory` (created 0700, each file 0600, in the order given, so later values still win), @file values
    as they are."""
    out = []
    for number, value in enumerate(values):
        if value.startswith("@"):
            out.append(value)
            continue
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, "extra-vars-%d.json" % number)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(parsed(value), handle)
        out.append("@" + path)
    return out
