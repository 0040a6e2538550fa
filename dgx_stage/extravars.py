"""The operator's -e values: checked before a run against the variables the plays, roles and inventory know
(name, choices, type, FORMATS), handed to ansible-playbook as files only the run can read (an inline value would
be in `ps`, ansible-runner's `command` artifact and run.json, and may be a token), recorded by name only.
Messages name an -e by its place, never by its text; a !vault value is refused (no vault password is passed)."""
import contextlib
import difflib
import glob
import io
import json
import math
import os
import re

import yaml

from dgx_stage import REPO, UsageError, use_module_utils

# Read by the playbooks themselves, not by a role's entry point.
PLAY_VARIABLES = {
    "lane": {"type": "str", "description": "the lane: an inventory group"},
    "become_root": {"type": "bool", "description": "become root on the nodes"},
    "engine_enabled": {"type": "bool", "description": "run the engine plays on this host"},
}
PLAYBOOK_FILES = ("stage-deepseek.yml", "playbooks/*.yml", "playbooks/tasks/*.yml")
SET_FACT = ("set_fact", "ansible.builtin.set_fact")
ROLE_CALLS = ("include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role")
# A variable name as -e gives it.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# How alike (difflib's ratio) an unknown name and a known one are when it is read as a typo of it: a letter or two
# apart in a name of ten or more.
TYPO = 0.85
BOOLEAN_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f")


def _loader():
    os.environ["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    from ansible.parsing.dataloader import DataLoader
    return DataLoader()


def which(position):
    """How a message names one -e value: by its place on the command line ("the 2nd -e"), never by its text,
    which may be or hold a token."""
    number = position + 1
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return "the %d%s -e" % (number, suffix)


def _causes(exc):
    """exc and what caused it, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _where(exc, text=None):
    """Where the text (given for an inline -e) breaks, after the YAML error behind exc, without the text around
    it: ' (line L, column C)', ' (at its end: ...)', or ''."""
    for cause in _causes(exc):
        mark = getattr(cause, "problem_mark", None)
        if mark is not None and text is not None and mark.index >= len(text.rstrip()):
            return " (at its end: a bracket or a quote is not closed)"
        if mark is not None:
            return " (line %d, column %d)" % (mark.line + 1, mark.column + 1)
    return ""


def _named(position, path=None):
    """An -e in a message: by its place, and an @file by its path too."""
    return "%s (%s)" % (which(position), path) if path else which(position)


def _plain_type(data):
    """What a value is, in plain words (not the class Ansible's loader gives it)."""
    for kind, said in ((bool, "true or false"), (str, "a string"), (list, "a list"), ((int, float), "a number")):
        if isinstance(data, kind):
            return said
    return "a %s" % type(data).__name__.lstrip("_")


def _vault_error(exc):
    """Whether exc (or what caused it) is Ansible's refusal to read vault-encrypted text without a password."""
    from ansible.parsing.vault import AnsibleVaultError
    return any(isinstance(cause, AnsibleVaultError) for cause in _causes(exc))


# dgx-stage has no vault option and passes ansible-playbook no vault password: a vaulted value stops the run there,
# with the line that holds it quoted in the run's log.
NO_VAULT_PASSWORD = "dgx-stage passes no vault password to ansible-playbook"
NO_VAULT = NO_VAULT_PASSWORD + ": give the value in plain text in an -e @FILE only you can read"


def parsed(value, path=None, position=0):
    """The variables one -e value (the `position`th, from 0) sets, as ansible-playbook reads it
    (ansible.utils.vars.load_extra_vars): @file or inline JSON/YAML through the data loader, anything else as
    key=value pairs; UsageError when it does not parse to a mapping, naming the -e by its place (and a file by
    its path), never by its text."""
    named = _named(position, path)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            if not path and not value.startswith(("{", "[")):
                from ansible.parsing.splitter import parse_kv
                return parse_kv(value)
            data = _loader().load_from_file(path) if path else _loader().load(value)
    except Exception as exc:   # Ansible's parse errors have no common base worth naming; their text quotes ours
        if _vault_error(exc):
            raise UsageError("%s is vault-encrypted; %s" % (named, NO_VAULT))
        raise UsageError("%s does not parse as %s%s; its text is not shown, as it may hold a secret"
                         % (named, "JSON or YAML" if path or value.startswith(("{", "[")) else
                            "NAME=VALUE pairs (a quote or a {{ left open)", _where(exc, None if path else value)))
    if not isinstance(data, dict) and data is not None:
        raise UsageError("%s is not a mapping of variables (%s)" % (named, _plain_type(data)))
    return data or {}


def variables_of(value, position=0):
    """The variables one resolved -e value (inline, or @file; the `position`th, from 0) sets."""
    return parsed(value, value[1:], position) if value.startswith("@") else parsed(value, position=position)


def _unwritable(data):
    """The names whose value JSON cannot carry (a YAML date, !!binary), sorted."""
    bad = []
    for name, given in data.items():
        try:
            json.dumps(given)
        except (TypeError, ValueError):
            bad.append(str(name))
    return sorted(bad)


def _holds_vault(value):
    from ansible.parsing.vault import EncryptedString
    if isinstance(value, dict):
        return any(_holds_vault(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_vault(item) for item in value)
    return isinstance(value, EncryptedString)


def _listed(names):
    return "%s %s" % (", ".join(names), "is" if len(names) == 1 else "are")


def resolve(values):
    """-e values with @file made absolute; UsageError for a missing file, a file or inline JSON/YAML that does
    not parse (ansible-playbook would stop with exit 1 and no host result), a !vault value anywhere (NO_VAULT),
    or an inline value that as_files cannot write as JSON."""
    out = []
    for position, value in enumerate(values):
        path = None
        if value.startswith("@"):
            path = value[1:]
            if not os.path.isfile(path):
                raise UsageError("extra vars file not found: %s" % path)
            value = "@" + os.path.abspath(path)
        data = parsed(value, path, position)
        vaulted = sorted(str(name) for name, given in data.items() if _holds_vault(given))
        if vaulted:
            raise UsageError("%s: %s %s a !vault value; %s" % (
                _named(position, path), ", ".join(vaulted), "holds" if len(vaulted) == 1 else "hold", NO_VAULT))
        bad = [] if path else _unwritable(data)
        if bad:
            raise UsageError("%s: %s a YAML date or binary value, which an inline -e cannot pass on: quote it as a "
                             "string, or give it in an -e @FILE" % (which(position), _listed(bad)))
        out.append(value)
    return out


def described(value):
    """How run.json records one -e value: a file by its path, an inline value by the names it sets."""
    if value.startswith("@"):
        return value
    names = sorted(str(name) for name in variables_of(value))
    return "%s (values not recorded)" % ", ".join(names) if names else "(nothing set)"


class _UntrustedDumper(yaml.SafeDumper):
    """YAML whose strings load through Ansible's loader as untrusted (!unsafe), as an inline -e is: Ansible
    trusts an @file's strings as templates, so a {{ in a value would be templated and its pieces shown in the
    error. A string that !unsafe would read as another type ("123", "true", "" re-resolve as plain scalars) goes
    untagged; no such string holds a {."""


def _represent_str(dumper, value):
    text = "tag:yaml.org,2002:str"
    unsafe = dumper.resolve(yaml.ScalarNode, value, (True, False)) == text
    return dumper.represent_scalar("!unsafe" if unsafe else text, value, style='"')


_UntrustedDumper.add_representer(str, _represent_str)


def as_files(values, directory):
    """The -e values as ansible-playbook gets them: each inline one, as JSON carries it, written as YAML with
    every string !unsafe (_UntrustedDumper) to a file of its own in `directory` (created 0700, each file 0600, in
    the order given, so later values still win), @file values as they are."""
    out = []
    for number, value in enumerate(values):
        if value.startswith("@"):
            out.append(value)
            continue
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, "extra-vars-%d.yml" % number)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            yaml.dump(json.loads(json.dumps(variables_of(value))), handle, Dumper=_UntrustedDumper,
                      allow_unicode=False, default_flow_style=False, sort_keys=False, width=2 ** 31)
        out.append("@" + path)
    return out


# --- which variables there are ------------------------------------------------------------------------------

def _load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def role_variables():
    """{name: {type, choices}} of every variable a role reads: its argument_specs (any entry point) and its
    defaults."""
    known = {}
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml"))):
        for entry in (_load_yaml(path).get("argument_specs") or {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                known.setdefault(name, {"type": spec.get("type", "str"), "choices": spec.get("choices")})
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "*", "defaults", "main.yml"))):
        for name in _load_yaml(path):
            known.setdefault(name, {"type": "raw", "choices": None})
    return known


def _names_set(node, found):
    if isinstance(node, list):
        for item in node:
            _names_set(item, found)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in SET_FACT and isinstance(value, dict):
                found.update(name for name in value if name != "cacheable")
            elif key in ROLE_CALLS:
                found.update((node.get("vars") or {}).keys())
            elif key == "vars" and ("hosts" in node or "block" in node) and isinstance(value, dict):
                found.update(value)
            _names_set(value, found)


def playbook_variables():
    """The names the playbooks set themselves (set_fact, play vars, the vars they pass to a role): an -e of
    one would override what the run computes (a host's rank, the lane's hosts, a report's fields)."""
    found = set()
    for pattern in PLAYBOOK_FILES:
        for path in sorted(glob.glob(os.path.join(REPO, pattern))):
            _names_set(_load_yaml(path), found)
    return found


def _unreadable_vars_file(inventory, exc):
    """The UsageError for a group_vars or host_vars file of `inventory` that Ansible could not read (exc): the file
    and where in it, never its text (Ansible's message quotes none, but a file there may hold a token)."""
    path, parse, merge = None, False, False
    for cause in _causes(exc):
        path = path or getattr(getattr(cause, "obj", None), "path", None)
        # A file that parses but is no mapping fails where its variables are merged, which names it only so.
        merged = re.match(r"Could not process '([^']+)'\.$", getattr(cause, "_original_message", None) or "")
        path, merge = path or (merged.group(1) if merged else None), merge or bool(merged)
        parse = parse or hasattr(cause, "problem_mark")
    why = ("is vault-encrypted, and " + NO_VAULT_PASSWORD if _vault_error(exc) else
           "is not YAML" + _where(exc) if parse else
           "is not a mapping of variables" if merge else "does not read as variables")
    return UsageError("inventory %s does not parse: %s %s; its text is not shown, as it may hold a secret; fix it "
                      "or pass another with -i" % (inventory, path or "one of its group_vars or host_vars files", why))


def inventory_variables(inventory):
    """(names the inventory defines for any host or group, its lanes: the groups with a host but Ansible's own all
    and ungrouped), read as ansible-playbook reads it (the inventory itself and its group_vars/host_vars; never
    the run's own extra vars); UsageError naming a group_vars or host_vars file that does not read."""
    os.environ["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.vars.plugins import get_vars_from_inventory_sources
    loader = _loader()
    sources = [inventory] if isinstance(inventory, str) else list(inventory)
    sources = [source if "," in source and not os.path.exists(source) else os.path.abspath(source)
               for source in sources]
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            manager = InventoryManager(loader=loader, sources=sources)
            names = set()
            for host in manager.get_hosts("all"):
                entities = [host] + host.get_groups()
                for entity in entities:
                    names.update(entity.get_vars())
                names.update(get_vars_from_inventory_sources(loader, sources, entities, "all"))
    except AnsibleError as exc:
        raise _unreadable_vars_file(inventory, exc)
    return names, sorted(name for name, group in manager.groups.items()
                         if name not in ("all", "ungrouped") and group.get_hosts())


# --- checking the values ---------------------------------------------------------------------------------------

def _templated(value):
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _close(name, names, cutoff=0.6):
    """The known name `name` is likely a typo of (difflib's ratio at least `cutoff`), or None."""
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=cutoff)
    return close[0] if close else None


def raw_text_problem(text, argument, place, names):
    """Why -e text without NAME= is refused. A name that is the whole -e argument is quoted when it is a known
    name or a typo of one; anything else is not shown, as it may be a value (a token given alone, or after
    --api-key, or in a JSON value split at its spaces)."""
    word = text.strip()
    if NAME.match(word) and word == argument.strip():
        if word in names or _close(word, names):
            return "-e %s has no value: write NAME=VALUE (e.g. -e stage_verify=full)" % word
        return ("%s is a word without =VALUE (not shown: it may be a secret): write NAME=VALUE (e.g. -e "
                "stage_verify=full)" % place)
    return ("%s holds text that is not NAME=VALUE (not shown: it may be part of a secret value). A value with "
            "spaces is split there: give it as JSON, e.g. -e '{\"engine_env\": {\"KEY\": \"value\"}}'" % place)


def value_problem(name, value, spec):
    """Why `value` cannot be `name` (its declared type or choices), or None. Text from key=value is read as
    Ansible converts it; a templated value is left to Ansible."""
    if _templated(value):
        return None
    kind, choices = spec.get("type"), spec.get("choices")
    if kind in ("dict", "list") and not isinstance(value, dict if kind == "dict" else list):
        # The value is not shown: a mapping such as engine_env holds secrets.
        return ("-e %s: %s is a %s; give it as JSON or YAML, e.g. -e '{\"%s\": %s}'"
                % (name, name, "mapping" if kind == "dict" else "list", name,
                   '{\"KEY\": \"value\"}' if kind == "dict" else '[\"item\"]'))
    # The value given is never shown: it may be a token pasted into the wrong variable.
    if choices and str(value) not in [str(choice) for choice in choices]:
        return "-e %s: %s is one of %s" % (name, name, ", ".join(str(c) for c in choices))
    if kind == "bool" and not (isinstance(value, bool) or str(value).lower() in BOOLEAN_WORDS):
        return "-e %s: %s is true or false" % (name, name)
    if kind == "int" and _number(value, int) is None:
        return "-e %s: %s is a whole number" % (name, name)
    number = _number(value, float)
    if kind == "float" and (number is None or not math.isfinite(number)):
        return "-e %s: %s is a finite number" % (name, name)
    if name in FORMATS and not FORMATS[name][0](value):
        return "-e %s: %s is %s" % (name, name, FORMATS[name][1])
    return None


def _reserve(value):
    """Whether the stage module reads `value` as a reserve (module_utils/dgx_space.py)."""
    use_module_utils()
    from ansible.module_utils.dgx_errors import StageError
    from ansible.module_utils.dgx_space import parse_reserve
    try:
        parse_reserve(value, 1)
        return True
    except StageError:
        return False


# str variables whose text the modules read in a form of their own: (whether a value reads, what it is).
FORMATS = {"stage_reserve": (_reserve, "bytes, a size such as 500G, or N% of the disk (below 100%)")}


def _number(value, kind):
    """value as kind (int, float) as Ansible converts text; None for a bool or text that is no such number."""
    try:
        return None if isinstance(value, bool) else kind(str(value).strip())
    except ValueError:
        return None


def problems(values, inventory, allow_unknown=False):
    """The problems of the -e values against the variables there are (each one line naming the variable and
    the fix); [] when none. A name is shown only when the plays know it or it is a typo of one they know: any
    other may be a value given where a name goes."""
    known = dict(role_variables(), **PLAY_VARIABLES)
    derived = playbook_variables()
    defined, lanes = inventory_variables(inventory)
    names = sorted(set(known) | defined)
    found = []
    for position, value in enumerate(values):
        place = _named(position, value[1:] if value.startswith("@") else None)
        for name, given in variables_of(value, position).items():
            if name == "_raw_params":
                found.append(raw_text_problem(given, value, place, names + sorted(derived)))
            elif name in derived:
                found.append("-e %s: the playbooks set %s themselves (it is not an input); leave it out"
                             % (name, name))
            elif str(name).startswith("_"):
                found.append("%s sets a name starting with _ (not shown): such names are the roles' own, not "
                             "inputs; leave it out" % place)
            elif name == "lane" and _templated(given):
                # Checked against the groups here, where no template is evaluated; in the plays one that does not
                # resolve falls back to the default lane.
                found.append("-e lane: lane is an inventory group's name, not a template: give the name itself")
            elif name == "lane" and str(given) not in lanes:
                found.append("-e lane: lane is an inventory group with hosts of %s: %s"
                             % (inventory, ", ".join(lanes) or "none"))
            elif name in known:
                problem = value_problem(name, given, known[name])
                if problem:
                    found.append(problem)
            elif not (str(name).startswith("ansible_") or name in defined):
                close = _close(name, names)
                if not close and not allow_unknown:
                    found.append("%s sets a name no play or role reads (not shown: it may be a secret; a site's "
                                 "own variable: --allow-unknown-vars)" % place)
                elif not allow_unknown:
                    found.append("-e %s: no play or role reads %s; did you mean %s? (a site's own variable: "
                                 "--allow-unknown-vars)" % (name, name, close))
                elif _close(name, names, TYPO):
                    # A site's own name a letter or two from a known one is far likelier a typo of it.
                    found.append("-e %s: no play or role reads %s; did you mean %s? (--allow-unknown-vars takes "
                                 "no name this close to a known one; a site's own variable can be defined in "
                                 "the inventory)" % (name, name, close))
    return found


def check(values, inventory, allow_unknown=False):
    """UsageError naming every problem of the -e values, before anything runs."""
    found = problems(values, inventory, allow_unknown)
    if found:
        raise UsageError("\n".join(found))
