"""The code that runs on the nodes (library/, module_utils/) uses the nodes' system Python as it is: the standard
library, Ansible's module_utils and this project's own, in Python 3.8 syntax."""
import ast
import glob
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_FILES = sorted(glob.glob(os.path.join(REPO, "library", "*.py")) +
                    glob.glob(os.path.join(REPO, "module_utils", "*.py")))


def imported_tops(tree):
    """The top-level package of every absolute import in a parsed file."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.module


def foreign_imports(source):
    """Imports that are neither the standard library nor ansible.module_utils."""
    return sorted(name for top, name in imported_tops(ast.parse(source))
                  if top not in sys.stdlib_module_names
                  and not (name == "ansible.module_utils" or name.startswith("ansible.module_utils.")))


@pytest.mark.parametrize("path", NODE_FILES, ids=os.path.basename)
def test_node_code_imports_only_the_stdlib_and_module_utils_in_python_38_syntax(path):
    with open(path) as handle:
        source = handle.read()
    ast.parse(source, feature_version=(3, 8))
    assert foreign_imports(source) == [], path


def test_the_checks_catch_a_third_party_import_and_newer_syntax():
    assert foreign_imports("import yaml\nfrom rich.table import Table\nimport json\n") == ["rich.table", "yaml"]
    assert foreign_imports("from ansible.module_utils.basic import AnsibleModule\n") == []
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 8))
