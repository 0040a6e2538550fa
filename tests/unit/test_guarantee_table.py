"""tests/README.md maps each guarantee README.md states to the one test that proves it: every test it names
exists, under that name, in that file, and every row names exactly one."""
import ast
import os
import re

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLE_HEADING = "## Guarantees and the test that proves each"
TEST_REF = re.compile(r"`((?:tests|molecule)/[\w./-]+\.py)::(\w+)(?:\[[^\]]*\])?`")


def table_rows(text):
    """(guarantee, [(path, test name)]) per row of the guarantee table."""
    lines = text.splitlines()
    start = lines.index(TABLE_HEADING)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|") or set(line.replace("|", "").strip()) <= set("-: "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0].lower() == "guarantee":
            continue
        rows.append((cells[0], TEST_REF.findall(line)))
    return rows


def defined_tests(path):
    """Every test function defined in a file, at module level or in a class."""
    with open(path) as handle:
        tree = ast.parse(handle.read(), filename=path)
    return set(node.name for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"))


def missing_tests(rows, root=REPO_ROOT):
    """'path::name' of every named test that does not exist."""
    missing = []
    for _guarantee, refs in rows:
        for path, name in refs:
            full = os.path.join(root, path)
            if not os.path.isfile(full) or name not in defined_tests(full):
                missing.append("%s::%s" % (path, name))
    return missing


@pytest.fixture(scope="module")
def rows():
    with open(os.path.join(REPO_ROOT, "tests", "README.md")) as handle:
        return table_rows(handle.read())


def test_every_test_the_table_names_exists(rows):
    assert len(rows) >= 30, "the guarantee table looks cut short: %d rows" % len(rows)
    assert missing_tests(rows) == []


def test_every_guarantee_names_exactly_one_test(rows):
    assert [guarantee for guarantee, refs in rows if len(refs) != 1] == []
    guarantees = [guarantee for guarantee, _refs in rows]
    assert len(set(guarantees)) == len(guarantees), "a guarantee is listed twice"


def test_the_checker_catches_a_renamed_test_and_a_row_without_one(tmp_path):
    test_file = tmp_path / "tests" / "unit" / "test_x.py"
    test_file.parent.mkdir(parents=True)
    test_file.write_text("def test_kept():\n    pass\n\nclass TestBox:\n    def test_inside(self):\n        pass\n")
    text = "\n".join([
        "# x", TABLE_HEADING, "",
        "| guarantee | test |", "|---|---|",
        "| kept | `tests/unit/test_x.py::test_kept` |",
        "| in a class, parametrised | `tests/unit/test_x.py::test_inside[podman]` |",
        "| renamed | `tests/unit/test_x.py::test_gone` |",
        "| no file | `tests/unit/test_y.py::test_kept` |",
        "| none | nothing named |",
        "## after", "| not | `tests/unit/test_x.py::test_after` |"])
    found = table_rows(text)
    assert [guarantee for guarantee, _refs in found] == ["kept", "in a class, parametrised", "renamed", "no file",
                                                          "none"]
    assert missing_tests(found, root=str(tmp_path)) == ["tests/unit/test_x.py::test_gone",
                                                        "tests/unit/test_y.py::test_kept"]
    assert [guarantee for guarantee, refs in found if len(refs) != 1] == ["none"]
