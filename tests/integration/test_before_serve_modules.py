"""engine_receipts, safetensors_check and engine_manifest run through ansible itself.

Ad-hoc `ansible localhost -m <module>` for each module's contract, and one playbook that runs the
before-serve sequence on a hubgen NAS hub (mirror, header check, receipts, manifest) and renders the
manifest with the same to_nice_json(indent=2) a role template uses.
"""
import json
import os
import struct
import subprocess
import sys

import pytest

from treestate import manifest_text

from ansible.module_utils.dgx_receipts import RECEIPT_ROOTS

from conftest import BIN_DIR, REPO_ROOT, ansible_env
RECEIPT_NAMES = list(RECEIPT_ROOTS)


def run_ansible(tmp_path, cmd):
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(tmp_path), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=300)
    try:
        return proc.returncode, json.loads(proc.stdout.decode("utf-8", "replace"))
    except ValueError:
        raise AssertionError("ansible rc=%d, output is not JSON:\n%s\n%s" % (
            proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")))


def adhoc(tmp_path, module, args, check=False):
    """Run one module on localhost; return its result dict (rc 2 exactly when it failed)."""
    cmd = [os.path.join(BIN_DIR, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", module, "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    rc, data = run_ansible(tmp_path, cmd)
    result = data["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert rc == (2 if result.get("failed") else 0), (rc, result)
    return result


# --- engine_receipts --------------------------------------------------------------------------

def make_receipts(parent):
    for name in RECEIPT_NAMES:
        os.makedirs(os.path.join(str(parent), name, "run"))
        path = os.path.join(str(parent), name, "run", "worker.json")
        with open(path, "w") as handle:
            handle.write("{}")
        os.chmod(path, 0o444)


def test_engine_receipts_check_then_remove_then_idempotent(tmp_path):
    parent = tmp_path / "cache"
    make_receipts(parent)
    expected = [str(parent / n) for n in RECEIPT_NAMES]

    checked = adhoc(tmp_path, "engine_receipts", {"parent": str(parent)}, check=True)
    assert checked["changed"] is True and checked["removed"] == expected
    assert sorted(os.listdir(str(parent))) == RECEIPT_NAMES

    first = adhoc(tmp_path, "engine_receipts", {"parent": str(parent), "state": "absent"})
    assert first["changed"] is True and first["removed"] == expected
    assert os.listdir(str(parent)) == []

    second = adhoc(tmp_path, "engine_receipts", {"parent": str(parent)})
    assert second["changed"] is False and second["removed"] == []


def test_engine_receipts_refuses_root_parent_and_held_files(tmp_path):
    refused = adhoc(tmp_path, "engine_receipts", {"parent": "/"})
    assert refused["failed"] and "'/'" in refused["msg"]

    parent = tmp_path / "cache"
    make_receipts(parent)
    held = os.path.join(str(parent), RECEIPT_NAMES[0], "run", "worker.json")
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(120)", held],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ready"
        result = adhoc(tmp_path, "engine_receipts", {"parent": str(parent)})
        assert result["failed"] and "pid %d" % holder.pid in result["msg"] and held in result["msg"]
        assert sorted(os.listdir(str(parent))) == RECEIPT_NAMES
    finally:
        holder.kill()
        holder.wait()


# --- safetensors_check ------------------------------------------------------------------------

def write_shard(path, names):
    """Minimal valid safetensors file: one 4-byte U8 tensor per name."""
    header = {name: {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]}
              for i, name in enumerate(names)}
    raw = json.dumps(header).encode()
    with open(str(path), "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * len(names)))


def test_safetensors_check_passes_then_catches_a_swapped_shard(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    write_shard(snap / "s1.safetensors", ["a.w", "a.b"])
    write_shard(snap / "s2.safetensors", ["b.w"])
    weight_map = {"a.w": "s1.safetensors", "a.b": "s1.safetensors", "b.w": "s2.safetensors"}
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    ok = adhoc(tmp_path, "safetensors_check", {"path": str(snap)})
    assert ok["changed"] is False and (ok["shards"], ok["tensors"]) == (2, 3)

    write_shard(snap / "s1.safetensors", ["b.w"])  # shard 1 now holds shard 2's content
    bad = adhoc(tmp_path, "safetensors_check", {"path": str(snap)})
    assert bad["failed"] and "Duplicate mapped checkpoint key: b.w" in bad["msg"]


def test_safetensors_check_tokenizer_only_repo_is_ok(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    result = adhoc(tmp_path, "safetensors_check", {"path": str(tmp_path)}, check=True)
    assert result["shards"] == 0 and "nothing to check" in result["msg"]


# --- the before-serve sequence on a hubgen NAS hub ---------------------------------------------

PLAY = """
- name: Before serve
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Stage both repos without the optional page15 pack
      hf_hub_mirror:
        src: "{{ nas }}"
        dest: "{{ loc }}"
        repo_id: "{{ item }}"
        ignore_patterns: "{{ ignore }}"
      loop: "{{ repo_ids }}"
      register: staged
    - name: Check shard headers
      safetensors_check:
        path: "{{ item.snapshot }}"
      loop: "{{ staged.results }}"
      register: headers
    - name: Clear receipts
      engine_receipts:
        parent: "{{ receipts }}"
      register: receipts_result
    - name: Compute mounts
      engine_manifest:
        hub_local_root: "{{ loc }}"
        hub_nas_root: "{{ nas }}"
        repos: "{{ repo_ids | map('community.general.dict_kv', 'repo_id') | list }}"
      register: mounts
    - name: Render the manifest as the role template does
      ansible.builtin.copy:
        content: "{{ mounts.manifest | to_nice_json(indent=2) }}"
        dest: "{{ out }}/manifest.json"
        mode: "0644"
    - name: Save the registered results for the test
      ansible.builtin.copy:
        content: "{{ {'headers': headers.results, 'receipts': receipts_result, 'mounts': mounts} | to_json }}"
        dest: "{{ out }}/results.json"
        mode: "0644"
"""


def test_before_serve_playbook_on_hubgen_hub(tmp_path, nas_hub, local_hub):
    if not os.path.exists(os.path.join(REPO_ROOT, "library", "hf_hub_mirror.py")):
        pytest.skip("hf_hub_mirror is not in this tree yet")
    receipts = tmp_path / "cache"
    make_receipts(receipts)
    out = tmp_path / "out"
    out.mkdir()
    play = tmp_path / "before-serve.yml"
    play.write_text(PLAY)
    repo_ids = sorted(nas_hub["repos"])
    extra = {"nas": nas_hub["hub"], "loc": str(local_hub), "receipts": str(receipts),
             "out": str(out), "repo_ids": repo_ids, "ignore": nas_hub["ignore_patterns"],
             "ansible_python_interpreter": sys.executable}
    rc, data = run_ansible(tmp_path, [os.path.join(BIN_DIR, "ansible-playbook"), "-i", "localhost,",
                                      "-c", "local", "-e", json.dumps(extra), str(play)])
    assert rc == 0, json.dumps(data["stats"])
    results = json.loads((out / "results.json").read_text())
    manifest = results["mounts"]["manifest"]

    assert (out / "manifest.json").read_text() == manifest_text(manifest)
    assert results["receipts"]["removed"] == [str(receipts / n) for n in RECEIPT_NAMES]
    assert all(h["shards"] > 0 for h in results["headers"])

    # Everything staged is local; the unstaged page15 pack is one read-only NAS dir per repo that has it.
    page15_repos = [r for r in repo_ids if nas_hub["repos"][r]["page15"]]
    staged_files = sum(len([p for p in nas_hub["repos"][r]["files"] if not p.startswith("page15/")])
                       for r in repo_ids)
    nas_mounts = [m for m in manifest["mounts"] if m["origin"] == "nas"]
    assert manifest["counts"] == {"local": staged_files, "nas": len(page15_repos),
                                  "total": staged_files + len(page15_repos)}
    assert all(m["read_only"] and m["target"].endswith("/page15") for m in nas_mounts)
    assert all(m["source"].startswith(str(local_hub) + "/") for m in manifest["mounts"]
               if m["origin"] == "local")
    targets = [m["target"] for m in manifest["mounts"]]
    assert targets == sorted(set(targets))
