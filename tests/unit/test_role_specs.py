"""The roles' public interface in meta/argument_specs.yml matches what they use (House conventions):
every default is documented with the exact text of defaults/main.yml, and every public variable a role
reads (its own, the inventory's, the lane facts) is an option of its spec."""
import glob
import os
import re

import pytest
import yaml

ROLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")
ROLE_NAMES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROLES, "*")) if os.path.isdir(p))
# Public names: the roles' own prefixes, the inventory's hub_* and the lane facts (select-lane.yml).
PUBLIC = re.compile(r"(?<![\w.'\"])((?:lane|hub|stage|engine|receipt|report)_[a-z0-9_]+)\b")


def names_set_by(tasks):
    """Registered results and the keys of set_fact and task/include vars, through blocks."""
    found = set()
    for task in tasks or []:
        found.update([task["register"]] if "register" in task else [])
        found.update(task.get("vars") or {})
        found.update(task.get("ansible.builtin.set_fact") or {})
        for section in ("block", "rescue", "always"):
            found.update(names_set_by(task.get(section)))
    return found


def load(path):
    with open(path) as handle:
        return yaml.safe_load(handle) or {}


def role_files(role, *subdirs):
    found = []
    for sub in subdirs:
        found += glob.glob(os.path.join(ROLES, role, sub, "**", "*"), recursive=True)
    return [p for p in found if os.path.isfile(p) and p.endswith((".yml", ".j2"))]


def spec_options(role):
    specs = load(os.path.join(ROLES, role, "meta", "argument_specs.yml"))["argument_specs"]
    return dict((entry, spec.get("options") or {}) for entry, spec in specs.items())


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_is_documented_with_its_exact_text(role):
    defaults = load(os.path.join(ROLES, role, "defaults", "main.yml"))
    entries = spec_options(role)
    documented = set()
    for entry, options in entries.items():
        for name, value in defaults.items():
            if name in options:
                documented.add(name)
                assert options[name].get("default") == value, (role, entry, name)
    assert sorted(set(defaults) - documented) == [], "defaults missing from %s's argument_specs" % role


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_public_variable_a_role_reads_is_in_its_spec(role):
    read, set_here = set(), set()
    for path in role_files(role, "tasks", "vars", "templates", "defaults"):
        with open(path) as handle:
            text = handle.read()
        read.update(name for expr in re.findall(r"{{(.*?)}}|when:(.*)|that:(.*)", text, re.S)
                    for part in expr for name in PUBLIC.findall(part))
        if "/tasks/" in path:
            set_here.update(names_set_by(yaml.safe_load(text)))
        elif "/vars/" in path:
            set_here.update(yaml.safe_load(text) or {})
    options = set(name for opts in spec_options(role).values() for name in opts)
    missing = sorted(read - set_here - options)
    assert missing == [], "%s reads %s but its argument_specs does not list them" % (role, missing)
