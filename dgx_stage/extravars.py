"""The operator's -e values: checked against the variables the plays, roles and inventory know, passed as files only
the run can read (not in `ps` or run.json), named in messages by place only (the text may be a token)."""
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
PLAY_VARIABLES = {"lane": {"type": "str"}, "become_root": {"type": "bool"}, "engine_enabled": {"type": "bool"}}
PLAYBOOK_FILES = ("stage-deepseek.yml", "playbooks/*.yml", "playbooks/tasks/*.yml")
SET_FACT = ("set_fact", "ansible.builtin.set_fact")
ROLE_CALLS = ("include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# difflib's ratio above which a site's own name is a typo of a known one: a letter or two apart in ten or more.
TYPO = 0.85
BOOLEAN_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0", "y", "n", "t", "f")
NO_VAULT_PASSWORD = "dgx-stage passes no vault password to ansible-playbook"
NO_VAULT = NO_VAULT_PASSWORD + ": give the value in plain text in an -e @FILE only you can read"
NOT_SHOWN = "its text is not shown, as it may hold a secret"


def _loader():
    os.environ["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    from ansible.parsing.dataloader import DataLoader
    return DataLoader()


def _named(position, path=None):
    """An -e in a message: "the 2nd -e", and an @file by its path too."""
    number = position + 1
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return "the %d%s -e" % (number, suffix) + (" (%s)" % path if path else "")


def _causes(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _where(exc, text=None):
    """Where the YAML behind exc breaks, without the text around it: ' (line L, column C)', ' (at its end: ...)'."""
    for cause in _causes(exc):
        mark = getattr(cause, "problem_mark", None)
        if mark is not None and text is not None and mark.index >= len(text.rstrip()):
            return " (at its end: a bracket or a quote is not closed)"
        if mark is not None:
            return " (line %d, column %d)" % (mark.line + 1, mark.column + 1)
    return ""


def _vault_error(exc):
    from ansible.parsing.vault import AnsibleVaultError
    return any(isinstance(cause, AnsibleVaultError) for cause in _causes(exc))


def variables_of(value, position=0):
    """The variables the `position`th -e sets, read as ansible.utils.vars.load_extra_vars reads it."""
    path = value[1:] if value.startswith("@") else None
    structured = path or value.startswith(("{", "["))
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            if not structured:
                from ansible.parsing.splitter import parse_kv
                return parse_kv(value)
            data = _loader().load_from_file(path) if path else _loader().load(value)
    except Exception as exc:   # Ansible's parse errors have no common base worth naming; their text quotes ours
        if _vault_error(exc):
            raise UsageError("%s is vault-encrypted; %s" % (_named(position, path), NO_VAULT))
        raise UsageError("%s does not parse as %s%s; %s" % (
            _named(position, path), "JSON or YAML" if structured else
            "NAME=VALUE pairs (a quote or a {{ left open)", _where(exc, None if path else value), NOT_SHOWN))
    if not isinstance(data, dict) and data is not None:
        kind = [said for kind, said in ((bool, "true or false"), (str, "a string"), (list, "a list"),
                                        ((int, float), "a number")) if isinstance(data, kind)]
        raise UsageError("%s is not a mapping of variables (%s)" % (
            _named(position, path), kind[0] if kind else "a " + type(data).__name__.lstrip("_")))
    return data or {}


def _holds_vault(value):
    from ansible.parsing.vault import EncryptedString
    if isinstance(value, (dict, list)):
        return any(_holds_vault(item) for item in (value.values() if isinstance(value, dict) else value))
    return isinstance(value, EncryptedString)


def _json_can_carry(value):
    try:
        return bool(json.dumps(value))
    except (TypeError, ValueError):
        return False


def resolve(values):
    """-e values with @file made absolute; UsageError for what ansible-playbook or as_files could not take."""
    out = []
    for position, value in enumerate(values):
        if value.startswith("@"):
            if not os.path.isfile(value[1:]):
                raise UsageError("extra vars file not found: %s" % value[1:])
            value = "@" + os.path.abspath(value[1:])
        data = variables_of(value, position)
        path = value[1:] if value.startswith("@") else None
        vaulted = sorted(str(name) for name, given in data.items() if _holds_vault(given))
        if vaulted:
            raise UsageError("%s: %s %s a !vault value; %s" % (
                _named(position, path), ", ".join(vaulted), "holds" if len(vaulted) == 1 else "hold", NO_VAULT))
        bad = [] if path else sorted(str(name) for name, given in data.items() if not _json_can_carry(given))
        if bad:
            raise UsageError("%s: %s %s a YAML date or binary value, which an inline -e cannot pass on: quote it as a "
                             "string, or give it in an -e @FILE" % (_named(position), ", ".join(bad),
                                                                    "is" if len(bad) == 1 else "are"))
        out.append(value)
    return out


def described(value):
    """How run.json records one -e value: a file by its path, an inline value by the names it sets."""
    if value.startswith("@"):
        return value
    names = sorted(str(name) for name in variables_of(value))
    return "%s (values not recorded)" % ", ".join(names) if names else "(nothing set)"


class _UntrustedDumper(yaml.SafeDumper):
    """YAML whose strings load as untrusted (!unsafe), as an inline -e's do; one !unsafe would retype holds no {."""


def _represent_str(dumper, value):
    text = "tag:yaml.org,2002:str"
    unsafe = dumper.resolve(yaml.ScalarNode, value, (True, False)) == text
    return dumper.represent_scalar("!unsafe" if unsafe else text, value, style='"')


_UntrustedDumper.add_representer(str, _represent_str)


def as_files(values, directory):
    """The -e values with each inline one written to its own 0600 file in `directory`, in order (later ones win)."""
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


def _load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def role_variables():
    """{name: {type, choices}} of every variable a role reads (argument_specs, defaults)."""
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
    """The names the playbooks set themselves: an -e of one would override what the run computes."""
    found = set()
    for pattern in PLAYBOOK_FILES:
        for path in sorted(glob.glob(os.path.join(REPO, pattern))):
            _names_set(_load_yaml(path), found)
    return found


class Inventory(object):
    """An inventory read once as ansible-playbook reads it: its hosts, the names it defines, its lanes."""

    def __init__(self, inventory):
        loader = _loader()   # first: it points Ansible's config at the repo's ansible.cfg
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.vars.plugins import get_vars_from_inventory_sources
        self.source = inventory
        sources = [inventory] if isinstance(inventory, str) else list(inventory)
        sources = [s if "," in s and not os.path.exists(s) else os.path.abspath(s) for s in sources]
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                self.manager = InventoryManager(loader=loader, sources=sources)
        except AnsibleError as exc:
            # ansible.cfg makes any source that does not parse fatal (a directory's one broken file included).
            why = [line.strip() for line in said.getvalue().splitlines() if "Failed to parse" in line]
            raise UsageError("inventory %s does not parse: %s%s; fix it or pass another with -i" % (
                inventory, str(exc).strip(), " (%s)" % why[0].replace("[WARNING]: ", "") if why else ""))
        self.warnings = [line.strip() for line in said.getvalue().splitlines() if line.strip()]
        self.names = set()
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                for host in self.manager.get_hosts("all"):
                    entities = [host] + host.get_groups()
                    for entity in entities:
                        self.names.update(entity.get_vars())
                    self.names.update(get_vars_from_inventory_sources(loader, sources, entities, "all"))
        except AnsibleError as exc:
            raise _unreadable_vars_file(inventory, exc)
        self.lanes = sorted(name for name, group in self.manager.groups.items()
                            if name not in ("all", "ungrouped") and group.get_hosts())

    def hosts(self, limit=None):
        """The hosts --limit selects (all without one), as ansible-playbook reads the pattern."""
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                self.manager.subset(limit)
                return [host.name for host in self.manager.get_hosts("all")]
        finally:
            self.manager.subset(None)


def _unreadable_vars_file(inventory, exc):
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
    return UsageError("inventory %s does not parse: %s %s; %s; fix it or pass another with -i"
                      % (inventory, path or "one of its group_vars or host_vars files", why, NOT_SHOWN))


def _templated(value):
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _close(name, names, cutoff=0.6):
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=cutoff)
    return close[0] if close else None


def raw_text_problem(text, argument, place, names):
    """Why -e text without NAME= is refused; it is quoted only when it is a known name or a typo of one."""
    word = text.strip()
    if NAME.match(word) and word == argument.strip():
        if word in names or _close(word, names):
            return "-e %s has no value: write NAME=VALUE (e.g. -e stage_verify=full)" % word
        return ("%s is a word without =VALUE (not shown: it may be a secret): write NAME=VALUE (e.g. -e "
                "stage_verify=full)" % place)
    return ("%s holds text that is not NAME=VALUE (not shown: it may be part of a secret value). A value with "
            "spaces is split there: give it as JSON, e.g. -e '{\"engine_env\": {\"KEY\": \"value\"}}'" % place)


def _number(value, kind):
    """value as kind (int, float) as Ansible converts text; None for a bool or text that is no such number."""
    try:
        return None if isinstance(value, bool) else kind(str(value).strip())
    except ValueError:
        return None


def _reserve(value):
    """Whether the stage module reads `value` as a reserve."""
    use_module_utils()
    from ansible.module_utils.dgx_errors import StageError
    from ansible.module_utils.dgx_space import parse_reserve
    try:
        parse_reserve(value, 1)
        return True
    except StageError:
        return False


def value_problem(name, value, spec):
    """Why `value` cannot be `name`, or None; never shows the value (it may be a misplaced token)."""
    if _templated(value):
        return None
    kind, choices = spec.get("type"), spec.get("choices")
    if kind in ("dict", "list") and not isinstance(value, dict if kind == "dict" else list):
        return ("-e %s: %s is a %s; give it as JSON or YAML, e.g. -e '{\"%s\": %s}'"
                % (name, name, "mapping" if kind == "dict" else "list", name,
                   '{\"KEY\": \"value\"}' if kind == "dict" else '[\"item\"]'))
    number = _number(value, float)
    said = ("one of " + ", ".join(str(c) for c in choices) if choices and str(value) not in map(str, choices) else
            "true or false" if kind == "bool" and not (isinstance(value, bool) or str(value).lower() in BOOLEAN_WORDS)
            else "a whole number" if kind == "int" and _number(value, int) is None else
            "a finite number" if kind == "float" and (number is None or not math.isfinite(number)) else
            "bytes, a size such as 500G, or N% of the disk (below 100%)" if name == "stage_reserve" and
            not _reserve(value) else None)
    return "-e %s: %s is %s" % (name, name, said) if said else None


def problems(values, inventory, allow_unknown=False):
    """One line per problem of the -e values; an unknown name is never shown (it may be a value)."""
    known = dict(role_variables(), **PLAY_VARIABLES)
    derived = playbook_variables()
    names = sorted(set(known) | inventory.names)
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
                # In the plays a lane template that does not resolve falls back to the default lane.
                found.append("-e lane: lane is an inventory group's name, not a template: give the name itself")
            elif name == "lane" and str(given) not in inventory.lanes:
                found.append("-e lane: lane is an inventory group with hosts of %s: %s"
                             % (inventory.source, ", ".join(inventory.lanes) or "none"))
            elif name in known:
                found.append(value_problem(name, given, known[name]))
            elif not (str(name).startswith("ansible_") or name in inventory.names):
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
    return [problem for problem in found if problem]


def check(values, inventory, allow_unknown=False):
    """UsageError naming every problem of the -e values, before anything runs."""
    found = problems(values, inventory, allow_unknown)
    if found:
        raise UsageError("\n".join(found))
