"""Every module in library/ documents what it takes and what it returns (House conventions).

For each module: DOCUMENTATION's options are its ARGUMENT_SPEC, field by field (suboptions too), and
main() builds its AnsibleModule from that very spec; RETURN is checked against real results of main(),
run in-process on small real fixtures (a synthetic NAS hub, a receipt directory with a live holder,
safetensors shards, an engine double serving HTTP on 127.0.0.1), on success and on failure:
every returned key (and every key inside a documented dict or list of dicts) is documented, every
key documented as returned in that case is there, and no key is returned where the docs say it is not.
The modules share one header, author line and attribute blocks.

The `returned:` grammar the checks read: clauses joined by "; ", each `always`, `success`, `failure`
(or `on failure`), optionally followed by `when <condition>` (a key inside `contains` may give only
`when <condition>`: it applies whenever its parent is returned). A condition is atoms joined by
" and ", each a choice joined by " or ". Atoms: `O(option=choice)`, `O(option) is set`, and a few
case facts the tests below state (`the run has a result`); any other atom (`in diff mode`) makes the
clause optional: the key may be there.
"""
import contextlib
import functools
import glob
import importlib.util
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading

import pytest
import yaml

import hubgen
import processes
from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS
from modrun import LIBRARY, REPO_ROOT, load, run_main

MODULES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(LIBRARY, "*.py")))

# Keys Ansible itself adds or every module may return (Ansible's common return values).
STANDARD = {"changed", "failed", "invocation", "warnings", "deprecations", "exception", "skipped"}

HEADER = [
    "#!/usr/bin/python",
    "# -*- coding: utf-8 -*-",
    "# Copyright: dgx-stage maintainers; GNU General Public License v3.0+ "
    "(see https://www.gnu.org/licenses/gpl-3.0.txt)",
    "from __future__ import absolute_import, division, print_function",
    "",
    "__metaclass__ = type",
    "",
    'DOCUMENTATION = r"""',
]
DOC_KEYS = ["module", "short_description", "version_added", "description", "author", "options",
            "extends_documentation_fragment", "attributes", "notes"]
IDEMPOTENT = "A second run with the same options and the same state reports C(changed=false)."

# Option fields: argument_spec name -> DOCUMENTATION name (the rest of a spec entry is not allowed here).
SPEC_FIELDS = {"type": "type", "required": "required", "default": "default", "choices": "choices",
               "elements": "elements", "options": "suboptions", "aliases": "aliases", "no_log": "no_log"}
DOC_ONLY_FIELDS = {"description", "version_added"}


def docs(name):
    module = load(name)
    return module, yaml.safe_load(module.DOCUMENTATION), yaml.safe_load(module.RETURN)


# ------------------------------------------------------------------------------------------------
# the `returned:` grammar
# ------------------------------------------------------------------------------------------------

OPTION_ATOM = re.compile(r"^O\((\w+)(?:=([\w.-]+))?\)( is set)?$")


def parse_returned(text):
    """[(outcome, [[atom, ...], ...])]: outcome always | success | failure | any (a nested key's
    bare `when`); the condition in conjunctive form (and of ors)."""
    clauses = []
    for clause in str(text).split(";"):
        clause = clause.strip()
        if clause.startswith("when "):
            head, cond = "", clause[len("when "):]
        else:
            head, _, cond = clause.partition(" when ")
        outcome = {"": "any", "always": "always", "success": "success", "failure": "failure",
                   "on failure": "failure"}.get(head.strip())
        assert outcome, "returned: %r - %r is not always/success/failure [when ...]" % (text, clause)
        cnf = [[atom.strip() for atom in part.split(" or ")] for part in cond.split(" and ")] if cond else []
        clauses.append((outcome, cnf))
    return clauses


def truths_for(spec, args, facts=None):
    """Atom -> bool for one run: O(option=choice) and O(option) is set from the effective options,
    plus the case's own facts."""
    truths = dict(facts or {})
    for name, entry in spec.items():
        value = args.get(name, entry.get("default"))
        truths["O(%s) is set" % name] = value is not None
        for choice in entry.get("choices") or []:
            truths["O(%s=%s)" % (name, choice)] = value == choice
    return truths


def check_atoms(returned, spec, where):
    """Every O(...) atom names a real option (and a real choice)."""
    for _outcome, cnf in parse_returned(returned):
        for atom in (a for part in cnf for a in part):
            match = OPTION_ATOM.match(atom)
            if atom.startswith("O(") or match:
                assert match, "%s: unreadable atom %r" % (where, atom)
                option, choice, _is_set = match.groups()
                assert option in spec, "%s: %r names no option" % (where, atom)
                if choice is not None:
                    assert choice in (spec[option].get("choices") or []), "%s: %r is no choice" % (where, atom)


def verdict(returned, outcome, truths):
    """True: must be returned here; False: must not be; None: may be."""
    if returned is None:
        return True
    maybe = False
    for clause_outcome, cnf in parse_returned(returned):
        if clause_outcome not in ("always", "any", outcome):
            continue
        value = True
        for part in cnf:
            values = [truths.get(atom) for atom in part]
            part_value = True if True in values else (False if all(v is False for v in values) else None)
            if part_value is False:
                value = False
                break
            if part_value is None:
                value = None
        if value is True:
            return True
        maybe = maybe or value is None
    return None if maybe else False


# ------------------------------------------------------------------------------------------------
# the checks
# ------------------------------------------------------------------------------------------------

TYPES = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,), "list": (list,), "dict": (dict,)}


def check_value(doc, value, where):
    if value is None or doc.get("type", "raw") == "raw":
        return
    kinds = TYPES[doc["type"]]
    assert isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds), \
        "%s is %r, documented as %s" % (where, value, doc["type"])
    if doc["type"] == "list" and doc.get("elements") in TYPES:
        for i, item in enumerate(value):
            check_value({"type": doc["elements"]}, item, "%s[%d]" % (where, i))


def check_keys(documented, result, outcome, truths, where):
    """`result`'s keys against `documented` (a RETURN mapping or a `contains`), recursively."""
    undocumented = sorted(set(result) - set(documented) - (STANDARD if where == "" else set()))
    assert undocumented == [], "%s returns undocumented keys %s" % (where or "the module", undocumented)
    for key, doc in documented.items():
        path = "%s.%s" % (where, key) if where else key
        expected = verdict(doc.get("returned"), outcome, truths)
        if expected is True:
            assert key in result, "%s is documented as returned here (%r) but is missing" % (path, doc.get("returned"))
        elif expected is False:
            assert key not in result, "%s is returned, but documented only as %r" % (path, doc.get("returned"))
        if key not in result:
            continue
        value = result[key]
        check_value(doc, value, path)
        contains = doc.get("contains")
        if contains and isinstance(value, dict):
            check_keys(contains, value, outcome, truths, path)
        elif contains and isinstance(value, list):
            for i, item in enumerate(value):
                check_keys(contains, item, outcome, truths, "%s[%d]" % (path, i))


def check_result(name, args, result, facts=None, expect_failure=False):
    """One real result of main() against the module's RETURN."""
    module, _doc, returns = docs(name)
    outcome = "failure" if result.get("failed") else "success"
    assert outcome == ("failure" if expect_failure else "success"), result.get("msg", result)
    check_keys(returns, result, outcome, truths_for(module.ARGUMENT_SPEC, args, facts), "")
    return result


def compare_options(documented, spec, where):
    assert sorted(documented) == sorted(spec), "%s: documented %s, argument_spec %s" % (
        where, sorted(documented), sorted(spec))
    for name, entry in spec.items():
        doc = documented[name]
        path = "%s.%s" % (where, name)
        assert set(entry) <= set(SPEC_FIELDS), "%s: spec fields %s this test does not know" % (
            path, sorted(set(entry) - set(SPEC_FIELDS)))
        assert set(doc) <= set(SPEC_FIELDS.values()) | DOC_ONLY_FIELDS, "%s: doc fields %s" % (path, sorted(doc))
        assert doc.get("description"), "%s has no description" % path
        assert doc.get("type", "str") == entry.get("type", "str"), path
        assert bool(doc.get("required")) == bool(entry.get("required")), path
        assert doc.get("default") == entry.get("default"), "%s default: doc %r, spec %r" % (
            path, doc.get("default"), entry.get("default"))
        assert isinstance(doc.get("default"), bool) == isinstance(entry.get("default"), bool), path
        assert list(doc.get("choices") or []) == list(entry.get("choices") or []), path
        assert doc.get("elements") == entry.get("elements"), path
        assert list(doc.get("aliases") or []) == list(entry.get("aliases") or []), path
        assert bool(doc.get("no_log")) == bool(entry.get("no_log")), path
        assert bool(doc.get("suboptions")) == bool(entry.get("options")), path
        if entry.get("options"):
            compare_options(doc["suboptions"], entry["options"], path)


def walk_returned(documented, where=""):
    for key, doc in documented.items():
        path = "%s.%s" % (where, key) if where else key
        yield path, doc
        for item in walk_returned(doc.get("contains") or {}, path):
            yield item


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name):
    module, doc, _returns = docs(name)
    assert doc["module"] == name
    compare_options(doc["options"], module.ARGUMENT_SPEC, name)


@pytest.mark.parametrize("name", MODULES)
def test_return_docs_are_complete_and_readable(name):
    module, _doc, returns = docs(name)
    for path, entry in walk_returned(returns):
        assert entry.get("description"), "%s has no description" % path
        assert entry.get("type") in set(TYPES) | {"raw"}, "%s: type %r" % (path, entry.get("type"))
        if "." not in path:
            assert entry.get("returned"), "%s has no returned:" % path
        if entry.get("returned") is not None:
            check_atoms(entry["returned"], module.ARGUMENT_SPEC, "%s %s" % (name, path))
        if entry["type"] == "dict" or entry.get("elements") == "dict":
            nested = path.count(".")
            # every top-level dict (and list of dicts) says what it contains
            assert entry.get("contains") or nested, "%s is a dict without contains:" % path
        if entry["type"] == "list":
            assert entry.get("elements"), "%s is a list without elements:" % path


@functools.lru_cache(maxsize=None)
def merged_docs():
    """ansible-doc's reading of every module, its documentation fragments merged in."""
    ansible_doc = os.path.join(os.path.dirname(sys.executable), "ansible-doc")
    if not os.path.exists(ansible_doc):
        pytest.skip("ansible-doc is not installed next to this Python")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, "ansible.cfg"))
    proc = subprocess.run([ansible_doc, "-M", LIBRARY, "--json"] + MODULES, cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    assert not proc.stderr.strip(), proc.stderr.decode()
    return {name: entry["doc"] for name, entry in json.loads(proc.stdout.decode()).items()}


@pytest.mark.parametrize("name", MODULES)
def test_one_header_author_and_attribute_style(name):
    with open(os.path.join(LIBRARY, name + ".py")) as handle:
        head = handle.read().split("\n")[:len(HEADER)]
    assert head == HEADER
    module, doc, _returns = docs(name)
    assert [k for k in doc if k != "notes"] == [k for k in DOC_KEYS if k != "notes"] and list(doc)[-1] in (
        "attributes", "notes"), list(doc)
    assert doc["author"] == "dgx-stage maintainers"
    assert doc["version_added"] == "1.0.0"
    # Ansible keeps the first value a key is given: the module's own, then dgx_node's, then Ansible's.
    assert doc["extends_documentation_fragment"][0] == "dgx_node"
    assert doc["extends_documentation_fragment"][-1] == "ansible.builtin.action_common_attributes"
    attributes = merged_docs()[name]["attributes"]
    assert sorted(attributes) == ["check_mode", "diff_mode", "idempotent", "platform"]
    for key in ("check_mode", "diff_mode", "idempotent"):
        assert attributes[key]["support"] in ("full", "partial", "none"), (key, attributes[key])
        assert isinstance(attributes[key]["details"], str) and attributes[key]["details"], (key, attributes[key])
    assert attributes["idempotent"]["description"] == IDEMPOTENT
    assert (attributes["platform"]["support"], attributes["platform"]["platforms"]) == ("full", "posix")
    assert attributes["check_mode"]["support"] == "full"   # every module supports check mode
    assert module.EXAMPLES.strip()


def test_ansible_doc_reads_every_module():
    parsed = merged_docs()
    assert sorted(parsed) == MODULES
    for name in MODULES:
        assert parsed[name]["attributes"]["check_mode"]["description"]   # the fragment was merged


# ------------------------------------------------------------------------------------------------
# fixtures: a synthetic NAS hub, staged once
# ------------------------------------------------------------------------------------------------

MAIN = hubgen.MAIN_REPO


def mirror_args(nas, local, **extra):
    args = {"src": nas["hub"], "dest": local, "repo_id": MAIN, "ignore_patterns": ["page15/"], "workers": 2}
    args.update(extra)
    return args


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A NAS hub and a local hub it was staged into by hf_hub_mirror (check mode first, with --diff)."""
    root = tmp_path_factory.mktemp("docs-hub")
    nas = hubgen.build_nas_hub(str(root / "nas"))
    local = str(root / "local")
    os.mkdir(local)
    args = mirror_args(nas, local, _ansible_diff=True)
    check = run_main("hf_hub_mirror", dict(args, _ansible_check_mode=True))
    real = run_main("hf_hub_mirror", args)
    return {"nas": nas, "local": local, "args": args, "check": check, "real": real}


def snapshot_of(staged):
    return os.path.join(staged["local"], hubgen.repo_folder(MAIN), "snapshots", staged["nas"]["repos"][MAIN]["commit"])


# ------------------------------------------------------------------------------------------------
# hf_hub_mirror
# ------------------------------------------------------------------------------------------------

HAS_RESULT = "the run has a result"


def test_hf_hub_mirror_success_and_check_mode_results(staged):
    real = check_result("hf_hub_mirror", staged["args"], staged["real"], {HAS_RESULT: True})
    assert real["report"]["status"] == "ok" and real["excluded_paths"] and "diff" in real
    check = check_result("hf_hub_mirror", staged["args"], staged["check"], {HAS_RESULT: True})
    assert check["report"]["status"] == "check" and check["blobs"]["copied"] > 0


def test_hf_hub_mirror_second_run_result(staged):
    again = check_result("hf_hub_mirror", staged["args"], run_main("hf_hub_mirror", staged["args"]),
                         {HAS_RESULT: True})
    assert again["changed"] is False and "diff" not in again


def test_hf_hub_mirror_failure_with_a_corrupt_nas_blob(tmp_path):
    """MirrorFailed: the module fails with its whole result (nas_corrupt, report, ...) and msg."""
    nas = hubgen.build_nas_hub(str(tmp_path / "nas"))
    shard = nas["repos"][MAIN]["shards"][0]
    nas_file = os.path.realpath(os.path.join(nas["hub"], nas["repos"][MAIN]["folder"], "snapshots",
                                             nas["repos"][MAIN]["commit"], shard))
    with open(nas_file, "r+b") as handle:   # bit rot: one byte of the middle flipped
        handle.seek(os.path.getsize(nas_file) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.mkdir(str(tmp_path / "local"))
    args = mirror_args(nas, str(tmp_path / "local"))
    result = check_result("hf_hub_mirror", args, run_main("hf_hub_mirror", args), {HAS_RESULT: True},
                          expect_failure=True)
    assert result["nas_corrupt"] == [shard] and result["nas_corrupt_blobs"][0]["local"] == "absent"
    assert result["report"]["status"] == "failed" and "do not hold the bytes their names say" in result["msg"]


def test_hf_hub_mirror_verify_pass_with_a_repair_and_one_refused_for_files_not_staged(tmp_path):
    """The verify pass's options: a repair (repairs, its warning) and a local hub with nothing staged
    (the module fails with its whole result, unstaged_paths naming the files)."""
    nas = hubgen.build_nas_hub(str(tmp_path / "nas"))
    local = str(tmp_path / "local")
    os.mkdir(local)
    run_main("hf_hub_mirror", mirror_args(nas, local))
    shard = nas["repos"][MAIN]["shards"][0]
    blob = os.path.join(local, nas["repos"][MAIN]["folder"], "blobs", nas["repos"][MAIN]["files"][shard]["etag"])
    with open(blob, "r+b") as handle:
        handle.write(b"\0")
    args = mirror_args(nas, local, verify="full", copy_missing=False, phase="verify")
    result = check_result("hf_hub_mirror", args, run_main("hf_hub_mirror", args), {HAS_RESULT: True})
    assert [r["path"] for r in result["repairs"]] == [shard] and result["bytes_read"]["local"] > 0
    empty = str(tmp_path / "empty")
    os.mkdir(empty)
    refused = dict(args, dest=empty)
    result = check_result("hf_hub_mirror", refused, run_main("hf_hub_mirror", refused), {HAS_RESULT: True},
                          expect_failure=True)
    assert "not staged" in result["msg"] and result["unstaged_paths"] and os.listdir(empty) == []


def test_hf_hub_mirror_failure_on_bad_input_has_msg_and_a_failed_row_without_figures(tmp_path):
    args = {"src": str(tmp_path / "no-nas"), "dest": str(tmp_path), "repo_id": MAIN}
    result = check_result("hf_hub_mirror", args, run_main("hf_hub_mirror", args), {HAS_RESULT: False},
                          expect_failure=True)
    assert "is the NAS mounted" in result["msg"]
    assert result["report"] == {"repo_id": MAIN, "repo_type": "model", "revision": "main", "phase": "stage",
                                "verify": "sample", "status": "failed", "check_mode": False}


def test_hf_hub_mirror_lock_timeout_returns_a_failed_row_the_table_reads_as_an_incomplete_pass(staged, tmp_path):
    from ansible.module_utils.dgx_localtree import LocalTree
    from ansible.module_utils.dgx_repolock import RepoLock
    from dgx_stage import table
    args = dict(staged["args"], phase="verify", verify="none", lock_timeout=0)
    with RepoLock(LocalTree(staged["local"]), ".locks/" + hubgen.repo_folder(MAIN), 0):
        result = check_result("hf_hub_mirror", args, run_main("hf_hub_mirror", args), {HAS_RESULT: False},
                              expect_failure=True)
    assert "holds" in result["msg"] and result["report"]["status"] == "failed" and "files" not in result["report"]
    # That row, beside a complete stage pass, leaves FILES to the stage pass; alone, FILES is unknown.
    stage = staged["real"]["report"]
    report = {"status": "failed", "passes": {"stage": [stage], "verify": [result["report"]]}}
    assert table.host_figures(report)["files_local"] == stage["files"]["local"]
    alone = table.host_figures(dict(report, passes={"verify": [result["report"]]}))
    assert alone["files_local"] is None and alone["files_unknown"] is True


# ------------------------------------------------------------------------------------------------
# engine_manifest, safetensors_check (on the staged hub)
# ------------------------------------------------------------------------------------------------

def test_engine_manifest_results(staged, tmp_path):
    args = {"hub_local_root": staged["local"], "hub_nas_root": staged["nas"]["hub"],
            "repos": [{"repo_id": MAIN, "allow_patterns": ["*"], "ignore_patterns": ["page15/"]},
                      {"repo_id": hubgen.DRAFTER_REPO}]}
    result = check_result("engine_manifest", args, run_main("engine_manifest", args))
    origins = set(m["origin"] for m in result["manifest"]["mounts"])
    assert origins == {"local", "nas"} and result["counts"] == result["manifest"]["counts"]
    bad = dict(args, hub_nas_root=str(tmp_path / "no-nas"))
    check_result("engine_manifest", bad, run_main("engine_manifest", bad), expect_failure=True)


def test_safetensors_check_results(staged, tmp_path):
    args = {"path": snapshot_of(staged)}
    result = check_result("safetensors_check", args, run_main("safetensors_check", args))
    assert result["shards"] > 0 and result["index"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}" + b"x")  # a trailing byte
    bad = {"path": str(tmp_path / "bad")}
    result = check_result("safetensors_check", bad, run_main("safetensors_check", bad), expect_failure=True)
    assert result["problems"]


# ------------------------------------------------------------------------------------------------
# engine_receipts
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def receipt_roots(tmp_path):
    parent = tmp_path / "cache"
    for name in RECEIPT_ROOTS:
        (parent / name).mkdir(parents=True)
    holder = subprocess.Popen(["sleep", "60"], cwd=str(parent / RECEIPT_ROOTS[0]))
    yield str(parent)
    processes.kill_tree(holder)


def test_engine_receipts_results(receipt_roots):
    args = {"parent": receipt_roots}
    refused = check_result("engine_receipts", args, run_main("engine_receipts", args), expect_failure=True)
    assert "sleep" in refused["msg"]
    check = dict(args, force=True, _ansible_check_mode=True)
    result = check_result("engine_receipts", check, run_main("engine_receipts", check))
    assert len(result["removed"]) == len(RECEIPT_ROOTS) and os.path.isdir(result["removed"][0])
    forced = dict(args, force=True)
    result = check_result("engine_receipts", forced, run_main("engine_receipts", forced))
    assert result["holders"] and result["holders"][0]["name"] == "sleep" and result["changed"] is True
    again = check_result("engine_receipts", args, run_main("engine_receipts", args))
    assert again["removed"] == [] and again["changed"] is False


# ------------------------------------------------------------------------------------------------
# engine_probe and engine_lane_wait, against the engine double on 127.0.0.1
# ------------------------------------------------------------------------------------------------

def load_engine_double():
    path = os.path.join(REPO_ROOT, "tests", "engine_double", "engine_double.py")
    spec = importlib.util.spec_from_file_location("engine_double_for_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def engine():
    """The engine double's HTTP API (no receipts, no container), streaming at 2000 tok/s."""
    double = load_engine_double()

    class Quiet(double.Handler):
        def log_message(self, fmt, *args):
            pass

    Quiet.double = double.Double("engine-double", 2000.0, 0.0)
    server = double.Server(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def closed_port():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BENCH = '{"prompt": "What is 6*7?", "expected": "42"}\n{"prompt": "Name a colour.", "expected": "blue"}\n'


@pytest.mark.parametrize("args, check", [
    ({"mode": "smoke"}, lambda r: r["passed"] is True and r["report"]["passed"] is True),
    ({"mode": "decode", "max_tokens": 20}, lambda r: r["tokens"] == 20 and "floor" not in r["report"]),
    ({"mode": "decode", "max_tokens": 20, "floor": 1.0}, lambda r: r["passed_floor"] and r["report"]["passed"]),
    ({"mode": "bench", "bench_jsonl": BENCH, "floor": 2},
     lambda r: (r["passed_items"], r["total_items"], r["passed_floor"], r["report"]["passed"],
                r["report"]["passed_items"]) == (1, 2, False, False, 1)),
    ({"mode": "bench", "bench_jsonl": BENCH}, lambda r: "passed_floor" not in r and "floor" not in r["report"]),
], ids=["smoke", "decode", "decode-floor", "bench-floor", "bench"])
def test_engine_probe_results(engine, args, check):
    args = dict(args, url=engine)
    result = check_result("engine_probe", args, run_main("engine_probe", args))
    assert check(result), result


def test_engine_lane_wait_results(engine):
    args = {"url": engine, "wait_for": 2}
    result = check_result("engine_lane_wait", args, run_main("engine_lane_wait", args))
    assert result["ready"] and result["report"] == {"models": ["engine-double"]}


def test_engine_probe_and_engine_lane_wait_results_when_the_api_is_down():
    url = "http://127.0.0.1:%d" % closed_port()
    waited = dict(url=url, wait_for=0.2)
    result = check_result("engine_lane_wait", waited, run_main("engine_lane_wait", waited))
    assert result["ready"] is False and result["running"] is True and "unreachable" in result["status"]
    smoke = dict(mode="smoke", url=url)
    result = check_result("engine_probe", smoke, run_main("engine_probe", smoke), expect_failure=True)
    assert "unreachable" in result["msg"]


# ------------------------------------------------------------------------------------------------
# engine_node_state, on the staged hub and a port this test listens on
# ------------------------------------------------------------------------------------------------

def test_engine_node_state_results(staged):
    """The manifest read on the node: its local binds' sources fingerprinted (a pruned one listed as missing),
    the receipt directory looked for; a manifest that is not there says why."""
    blobs = os.path.join(staged["local"], hubgen.repo_folder(MAIN), "blobs")
    files = [os.path.join(blobs, name) for name in sorted(os.listdir(blobs))] + [os.path.join(blobs, "pruned")]
    manifest_path = os.path.join(str(staged["local"]), "engine-manifest.json")
    manifest = {"repos": [{"repo_id": MAIN}],
                "mounts": [{"source": path, "target": "/hub/%d" % index, "origin": "local"}
                           for index, path in enumerate(files)]
                + [{"source": "/nas/b", "target": "/hub/b", "origin": "nas"}],
                "counts": {"local": len(files), "nas": 1, "total": len(files) + 1}}
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle)
    args = {"manifest": manifest_path, "directories": [str(staged["local"]), manifest_path + ".d"]}
    result = check_result("engine_node_state", args, run_main("engine_node_state", args))
    assert result["manifest"] == manifest and result["manifest_error"] == ""
    assert result["files"] == len(files) and result["missing"] == [files[-1]]
    assert result["directories_missing"] == [manifest_path + ".d"]
    given = {"manifest_content": manifest}
    assert check_result("engine_node_state", given, run_main("engine_node_state", given))["fingerprint"] == \
        result["fingerprint"]
    args = {"manifest": manifest_path + ".gone"}
    result = check_result("engine_node_state", args, run_main("engine_node_state", args))
    assert result["manifest"] is None and "No such file" in result["manifest_error"] and result["files"] == 0
    unseen = {"directories": ["x" * 5000]}
    result = check_result("engine_node_state", unseen, run_main("engine_node_state", unseen), expect_failure=True)
    assert "cannot look for" in result["msg"]
    both = {"manifest": manifest_path, "manifest_content": manifest}
    result = check_result("engine_node_state", both, run_main("engine_node_state", both), expect_failure=True)
    assert "mutually exclusive" in result["msg"]


# ------------------------------------------------------------------------------------------------
# engine_containers, with a runtime CLI that prints captured inspect data
# ------------------------------------------------------------------------------------------------

FAKE_RUNTIME = """#!/bin/sh
case "$1 $2" in
  "ps --all") echo %(id)s ;;
  "inspect --type") cat %(inspect)s ;;
  "image inspect") [ -e %(image)s ] && cat %(image)s || { echo "no such image: SECRET-VALUE" >&2; exit 1; } ;;
  "pull "*) echo sha256:%(id)s > %(image)s ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    """(the captured container's inspect data, the fake `docker` first on PATH that prints it)."""
    with open(os.path.join(os.path.dirname(__file__), "fixtures", "docker", "container_info.json")) as handle:
        info = json.load(handle)["container"]
    with open(str(tmp_path / "inspect.json"), "w") as handle:
        json.dump([info], handle)
    binary = tmp_path / "docker"
    binary.write_text(FAKE_RUNTIME % {"id": info["Id"], "inspect": tmp_path / "inspect.json",
                                      "image": tmp_path / "image-id"})
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    return info, binary


def test_engine_containers_results(fake_docker):
    """The containers a runtime lists, the engine's own, an image pulled as allowed (not in check mode), who
    holds a port, the node's Python; a runtime that fails says so without the secrets."""
    info, binary = fake_docker
    name = info["Name"].lstrip("/")
    args = {"runtime": "docker", "name": name, "image": "localhost/engine:1", "pull": "missing",
            "env": {"TOKEN": "SECRET-VALUE"}}
    result = check_result("engine_containers", args, run_main("engine_containers", args, check_mode=True))
    assert result["own"]["name"] == name and result["running"] and result["container_id"] == info["Id"]
    assert result["own"]["env_changed"] == ["TOKEN"] and result["image_id"] == "" and not result["changed"]
    result = check_result("engine_containers", args, run_main("engine_containers", args))
    assert result["changed"] and result["image_present"] and result["image_id"] == "sha256:" + info["Id"]
    # The listing holds names only (the invocation holds env: the task that passes it is no_log).
    assert "SECRET-VALUE" not in json.dumps(dict(result, invocation=None))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        args = {"runtime": "docker", "containers": False, "port": sock.getsockname()[1],
                "python_modules": ["json", "dgx_no_such_module"]}
        result = check_result("engine_containers", args, run_main("engine_containers", args))
    assert [h["pid"] for h in result["port_holders"]] == [os.getpid()] and "containers" not in result
    assert result["python"]["missing"] == ["dgx_no_such_module"] and result["python"]["executable"] == sys.executable
    bad = {"runtime": "docker", "port": 70000}
    assert "1-65535" in check_result("engine_containers", bad, run_main("engine_containers", bad),
                                     expect_failure=True)["msg"]
    binary.write_text("#!/bin/sh\necho 'cannot connect: SECRET-VALUE' >&2\nexit 1\n")
    failed = {"runtime": "docker", "redact": ["SECRET-VALUE"]}
    result = check_result("engine_containers", failed, run_main("engine_containers", failed), expect_failure=True)
    assert result["msg"].startswith("docker ps: cannot connect") and "SECRET-VALUE" not in result["msg"]


def test_engine_containers_keeps_a_label_that_equals_a_secret(fake_docker):
    """A container label holding the same text as a secret (the lane name here, a port) reads as it is: the
    plan tells the lane's containers and their settings apart by their labels."""
    info, _binary = fake_docker
    lane = info["Config"]["Labels"]["dgx-stage.lane"]
    args = {"runtime": "docker", "name": info["Name"].lstrip("/"), "redact": [lane]}
    result = check_result("engine_containers", args, run_main("engine_containers", args))
    assert result["own"]["labels"]["dgx-stage.lane"] == lane


def test_every_task_that_hands_engine_containers_secrets_is_no_log():
    """engine_containers takes env and redact as plain options: the task that passes either hides its
    arguments (no_log) and says a failure through a task of its own."""
    found = []
    for path in glob.glob(os.path.join(REPO_ROOT, "roles", "*", "tasks", "*.yml")):
        with open(path) as handle:
            for task in yaml.safe_load(handle) or []:
                args = task.get("engine_containers") if isinstance(task, dict) else None
                if isinstance(args, dict) and ("env" in args or "redact" in args):
                    found.append(os.path.basename(path))
                    assert task.get("no_log") is True, (path, task.get("name"))
    assert "plan.yml" in found and "status.yml" in found


def _tasks_with_no_log(tasks, inherited=False):
    """(task, its no_log as Ansible applies it: its own, else its enclosing block's) of tasks and their blocks."""
    for task in tasks or []:
        if isinstance(task, dict):
            no_log = task.get("no_log", inherited)
            yield task, no_log
            for part in ("block", "rescue", "always"):
                yield from _tasks_with_no_log(task.get(part), no_log)


def test_every_container_task_is_no_log():
    """A container module's result holds the container's inspect data (its environment, the API key): every task
    that creates, starts or stops one hides its result, itself or through its block."""
    modules = ("community.docker.docker_container", "containers.podman.podman_container")
    found = []
    for path in glob.glob(os.path.join(REPO_ROOT, "roles", "*", "tasks", "*.yml")):
        with open(path) as handle:
            for task, no_log in _tasks_with_no_log(yaml.safe_load(handle)):
                if any(module in task for module in modules):
                    found.append(os.path.basename(path))
                    assert no_log is True, (path, task.get("name"))
    assert found.count("container.yml") == 2 and found.count("strays.yml") == 2


# ------------------------------------------------------------------------------------------------
# the checker itself
# ------------------------------------------------------------------------------------------------

def test_the_returned_grammar():
    truths = {"O(mode=wait)": False, "O(mode=decode)": True, "O(floor) is set": False}
    assert verdict("always", "failure", truths) is True
    assert verdict("success", "failure", truths) is False
    assert verdict("success when O(mode=wait)", "success", truths) is False
    assert verdict("success when O(mode=wait) or O(mode=decode)", "success", truths) is True
    assert verdict("success when O(mode=decode) and O(floor) is set", "success", truths) is False
    assert verdict("success when in diff mode", "success", truths) is None
    assert verdict("success; on failure when the run has a result", "failure",
                   dict(truths, **{HAS_RESULT: True})) is True
    assert verdict("when O(mode=decode)", "success", truths) is True
    with pytest.raises(AssertionError):
        parse_returned("sometimes")


def test_the_checker_catches_an_undocumented_and_a_missing_key():
    documented = {"a": {"description": "x", "returned": "success", "type": "int"},
                  "d": {"description": "x", "returned": "success", "type": "dict",
                        "contains": {"k": {"description": "x", "type": "str"}}}}
    check_keys(documented, {"a": 1, "d": {"k": "v"}, "changed": False}, "success", {}, "")
    for result in ({"a": 1, "d": {"k": "v"}, "extra": 1}, {"d": {"k": "v"}}, {"a": 1, "d": {}},
                   {"a": 1, "d": {"k": "v", "j": 1}}, {"a": "1", "d": {"k": "v"}}):
        with pytest.raises(AssertionError):
            check_keys(documented, result, "success", {}, "")

