"""The roles' public interface in meta/argument_specs.yml matches what they use (House conventions):
every default is documented with the exact text of defaults/main.yml, and every variable an entry
point reads that the role does not set itself (its own public ones, the inventory's, the lane facts of
playbooks/select-lane.yml) is an option of that entry point's spec. Reads are followed through the
role's include_tasks and through the definitions in defaults/ and vars/ they use."""
import glob
import os
import re
import sys

import pytest
import yaml

ROLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")
ROLE_NAMES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROLES, "*")) if os.path.isdir(p))
# Task keys whose value is a bare Jinja expression.
BARE_EXPRESSION_KEYS = ("when", "that", "until", "failed_when", "changed_when")
# Names Ansible and Jinja provide.
BUILTINS = set("""item ansible_check_mode ansible_diff_mode ansible_play_hosts ansible_play_hosts_all
    ansible_play_batch ansible_facts ansible_run_tags ansible_failed_task ansible_failed_result
    inventory_hostname groups hostvars role_path playbook_dir inventory_dir omit lookup query range now
    true false none True False None and or not in is if else for loop lipsum dict""".split())
STRING = re.compile(r"'[^']*'|\"[^\"]*\"")
# Reads through a string: hostvars[...]['name'] and the vars lookup.
INDIRECT = re.compile(r"hostvars\[[^\]]+\]\[\s*['\"](\w+)['\"]\s*\]|lookup\(\s*['\"](?:ansible\.builtin\.)?vars['\"]"
                      r"\s*,\s*['\"](\w+)['\"]")
NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\b(?!\s*\()(?!\s*=[^=])")


def load(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def expression_names(expression):
    """Variable names an expression reads (attributes, filters, tests, calls and keywords left out)."""
    names = set(a or b for a, b in INDIRECT.findall(expression)) - set(["ansible_host", "ansible_user"])
    bare = STRING.sub("''", expression)
    bare = re.sub(r"\|\s*[\w.]+", "|", bare)                 # filter names
    bare = re.sub(r"\bis\s+(not\s+)?\w+", "is", bare)         # test names
    names.update(n for n in NAME.findall(bare) if n not in BUILTINS and not n.startswith("ansible_"))
    return names


def value_names(value, bare=False):
    if isinstance(value, dict):
        return set().union(*[value_names(v) for v in value.values()]) if value else set()
    if isinstance(value, list):
        return set().union(*[value_names(v, bare) for v in value]) if value else set()
    if not isinstance(value, str):
        return set()
    parts = [value] if bare else re.findall(r"{{(.*?)}}|{%(.*?)%}", value, re.S)
    return set().union(*[expression_names(p if isinstance(p, str) else " ".join(p)) for p in parts]) if parts \
        else set()


def task_reads(tasks, role):
    """(names read, names set, task files included) of a task list, through blocks."""
    read, set_here, includes = set(), set(), set()
    for task in tasks or []:
        for key, value in task.items():
            if key in ("block", "rescue", "always"):
                sub = task_reads(value, role)
                read |= sub[0]
                set_here |= sub[1]
                includes |= sub[2]
            elif key in BARE_EXPRESSION_KEYS:
                read |= value_names(value, bare=True)
            elif key == "register":
                set_here.add(value)
            elif key == "loop_control" and isinstance(value, dict) and "loop_var" in value:
                set_here.add(value["loop_var"])
                read |= value_names(value)
            elif key == "vars":
                set_here.update(value)
                read |= value_names(value)
            elif key == "ansible.builtin.set_fact":
                set_here.update(value)
                read |= value_names(value)
            elif key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
                includes.add(value if isinstance(value, str) else value["file"])
            elif key == "ansible.builtin.template":
                read |= value_names(value)
                with open(os.path.join(ROLES, role, "templates", value["src"])) as handle:
                    read |= value_names(handle.read())
            elif key == "name":
                read |= value_names(value)
            else:
                read |= value_names(value)
    return read, set_here, includes


def entry_point_reads(role, entry):
    """Every name the entry point reads and does not set, following includes and definitions."""
    tasks_dir = os.path.join(ROLES, role, "tasks")
    read, set_here, todo, seen = set(), set(), ["%s.yml" % entry], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        file_read, file_set, includes = task_reads(load(os.path.join(tasks_dir, name)), role)
        read |= file_read
        set_here |= file_set
        todo.extend(includes)
    defaults = load(os.path.join(ROLES, role, "defaults", "main.yml"))
    derived = load(os.path.join(ROLES, role, "vars", "main.yml")) if os.path.exists(
        os.path.join(ROLES, role, "vars", "main.yml")) else {}
    frontier = set(read)
    while frontier:                         # through the definitions the reads use
        name = frontier.pop()
        for table in (defaults, derived):
            if name in table:
                new = value_names(table[name]) - read
                read |= new
                frontier |= new
    return read - set_here - set(derived), defaults


def spec_of(role):
    return load(os.path.join(ROLES, role, "meta", "argument_specs.yml"))["argument_specs"]


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_is_documented_with_its_exact_text(role):
    defaults = load(os.path.join(ROLES, role, "defaults", "main.yml"))
    documented = set()
    for entry, spec in spec_of(role).items():
        for name, option in (spec.get("options") or {}).items():
            if name in defaults:
                documented.add(name)
                assert option.get("default") == defaults[name], (role, entry, name)
    assert sorted(set(defaults) - documented) == [], "defaults missing from %s's argument_specs" % role


@pytest.mark.parametrize("role, entry", [(role, entry) for role in ROLE_NAMES for entry in sorted(spec_of(role))])
def test_every_variable_an_entry_point_reads_is_in_its_spec(role, entry):
    reads, _defaults = entry_point_reads(role, entry)
    options = set(spec_of(role)[entry].get("options") or {})
    missing = sorted(reads - options)
    assert missing == [], "%s:%s reads %s but its argument_specs does not list them" % (role, entry, missing)


def test_the_checker_sees_indirect_and_bare_reads():
    assert expression_names("hostvars[inventory_hostname]['engine_port'] | default(8)") == {"engine_port"}
    assert expression_names("lookup('ansible.builtin.vars', 'engine_name')") == {"engine_name"}
    assert expression_names("lane if x is defined else y.attr | map('z', target=q)") == {"lane", "x", "y", "q"}
    assert value_names("not lane_engine_runs and become_root", bare=True) == {"lane_engine_runs", "become_root"}


def test_the_engine_reads_the_host_reports_where_the_lane_facts_say_they_are_written():
    engine = load(os.path.join(ROLES, "engine", "defaults", "main.yml"))
    assert engine["engine_report_dir"] == "{{ lane_report_dir }}"
    lane_facts = load(os.path.join(os.path.dirname(ROLES), "playbooks", "select-lane.yml"))[1]["tasks"][1]
    assert "lane_report_dir" in lane_facts["ansible.builtin.set_fact"]


# --- bool inputs are read through | bool ----------------------------------------------------------------------

REPO = os.path.dirname(ROLES)
# Where the plays and roles read variables in templates: tasks, vars, defaults, playbooks and Jinja templates.
TEMPLATE_FILES = ("roles/*/tasks/*.yml", "roles/*/handlers/*.yml", "roles/*/vars/*.yml", "roles/*/defaults/*.yml",
                  "roles/*/templates/*", "playbooks/*.yml", "playbooks/tasks/*.yml", "stage-deepseek.yml")


def bool_inputs():
    """The bool-typed inputs an -e or the inventory can set: the roles' bool options and the plays' own, but not
    those the playbooks set themselves (computed through | bool where they are set, and above any -e's reach)."""
    sys.path.insert(0, REPO)
    from dgx_stage import extravars
    known = dict(extravars.role_variables(), **extravars.PLAY_VARIABLES)
    return sorted(set(name for name, spec in known.items() if spec["type"] == "bool")
                  - extravars.playbook_variables())


def raw_bool_reads(template, names):
    """The names of `names` the Jinja `template` reads without | bool (after any | default(...)): an -e gives text,
    and the string "false" is true in a condition. A test of whether one is defined reads no truth."""
    import jinja2
    tokens = [(token.type, token.value) for token in jinja2.Environment().lexer.tokenize(template)]
    raw = []
    for index, (kind, value) in enumerate(tokens):
        if kind != "name" or value not in names or tokens[index + 1][0] == "assign":
            continue
        after = index + 1
        while tokens[after:after + 3] == [("pipe", "|"), ("name", "default"), ("lparen", "(")] or \
                tokens[after:after + 3] == [("pipe", "|"), ("name", "d"), ("lparen", "(")]:
            depth, after = 1, after + 3
            while depth:
                depth += {"lparen": 1, "rparen": -1}.get(tokens[after][0], 0)
                after += 1
        following = [token[1] for token in tokens[after:after + 4]]
        if following[:2] == ["|", "bool"] or following[:2] in (["is", "defined"], ["is", "undefined"]) or \
                following[:3] == ["is", "not", "defined"]:
            continue
        raw.append(value)
    return raw


def template_strings(node, bare=False):
    """Every template in a loaded YAML document, a bare expression (when:, that:, ...) wrapped as one."""
    if isinstance(node, dict):
        for key, value in node.items():
            for found in template_strings(value, key in BARE_EXPRESSION_KEYS):
                yield found
    elif isinstance(node, list):
        for item in node:
            for found in template_strings(item, bare):
                yield found
    elif isinstance(node, str) and (bare or "{{" in node or "{%" in node):
        yield "{{ %s }}" % node if bare and "{{" not in node else node


def test_every_bool_input_is_read_through_the_bool_filter():
    names = bool_inputs()
    assert {"engine_stop_strays", "engine_allow_corrupt_nas", "receipt_force", "engine_enabled",
            "stage_peer_fanout", "stage_prune", "become_root"} <= set(names), names
    raw = []
    for pattern in TEMPLATE_FILES:
        for path in sorted(glob.glob(os.path.join(REPO, pattern))):
            if path.endswith((".yml", ".yaml")):
                templates = list(template_strings(load(path)))
            else:
                with open(path) as handle:
                    templates = [handle.read()]
            raw += ["%s: %s" % (os.path.relpath(path, REPO), name)
                    for template in templates for name in raw_bool_reads(template, names)]
    assert raw == [], "read without | bool (an -e gives the text 'false', which is true): %s" % ", ".join(raw)


def test_the_bool_checker_sees_raw_reads_and_passes_filtered_ones():
    names = ["flag"]
    assert raw_bool_reads("{{ flag and x }}", names) == ["flag"]
    assert raw_bool_reads("{{ 'yes' if flag else 'flag is off' }}", names) == ["flag"]
    assert raw_bool_reads("{% if hostvars[h].flag %}x{% endif %}", names) == ["flag"]
    assert raw_bool_reads("{{ flag | default(false) }}", names) == ["flag"]
    assert raw_bool_reads("{{ flag | default(lookup('env', 'F') | length > 0) | bool and x }}", names) == []
    assert raw_bool_reads("{{ flag is not defined or flag | bool }}", names) == []
    assert raw_bool_reads("text naming flag, then {{ other }}", names) == []
    assert list(template_strings({"when": "flag and x", "msg": "flag", "that": ["flag | bool"]})) == [
        "{{ flag and x }}", "{{ flag | bool }}"]


def _mirror_calls(tasks, defaults=None):
    """(task name, hf_hub_mirror arguments with the module_defaults of its blocks) of every call in tasks."""
    for task in tasks or []:
        scope = dict(defaults or {})
        scope.update((task.get("module_defaults") or {}).get("hf_hub_mirror") or {})
        if "hf_hub_mirror" in (task.get("module_defaults") or {}):
            yield "module_defaults of %s" % task.get("name"), scope
        if "hf_hub_mirror" in task:
            yield task.get("name"), dict(scope, **(task["hf_hub_mirror"] or {}))
        for key in ("block", "rescue", "always"):
            for found in _mirror_calls(task.get(key), scope):
                yield found


def test_every_hf_hub_mirror_call_of_the_stage_role_reads_under_the_pass_cap_and_class():
    calls = []
    for path in sorted(glob.glob(os.path.join(ROLES, "stage", "tasks", "*.yml"))):
        calls += list(_mirror_calls(load(path)))
    assert len([name for name, args in calls if "src" in args]) >= 2
    for name, args in calls:
        if "src" in args:    # mirror-sync.yml and mirror-job.yml take all theirs from mirror.yml's module_defaults
            assert args.get("max_mib_s") == "{{ _stage_read_limits.max_mib_s }}", name
            assert args.get("io_priority") == "{{ _stage_read_limits.io_priority }}", name
