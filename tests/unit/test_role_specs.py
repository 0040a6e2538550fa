"""The roles' public interface in meta/argument_specs.yml matches what they use (House conventions):
every default is documented with the exact text of defaults/main.yml, and every variable an entry
point reads that the role does not set itself (its own public ones, the inventory's, the lane facts of
playbooks/select-lane.yml) is an option of that entry point's spec. Reads are followed through the
role's include_tasks and through the definitions in defaults/ and vars/ they use."""
import glob
import os
import re

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


def test_the_engine_reads_the_host_reports_where_the_report_role_writes_them():
    engine = load(os.path.join(ROLES, "engine", "defaults", "main.yml"))
    report = load(os.path.join(ROLES, "report", "defaults", "main.yml"))
    assert engine["engine_report_dir"] == report["report_dir"]
