"""tests/module_build_cache/sitecustomize.py: a module compiled from a zip once per run, its code still true;
a module payload's module_utils found once per run, the payload byte for byte what Ansible builds."""
import datetime
import importlib.util
import io
import marshal
import pickle
import os
import subprocess
import sys
import uuid
import warnings
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(os.path.dirname(HERE), "module_build_cache")


@pytest.fixture
def shim():
    spec = importlib.util.spec_from_file_location("module_build_cache_shim", os.path.join(SHIM_DIR, "sitecustomize.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_second_compile_comes_from_the_cache_with_the_new_zips_file_name(shim, tmp_path):
    source = b"def answer():\n    return 127 * 89\n"
    first = shim.cached_compile("/tmp/a/payload.zip/pkg/mod.py", source, cache_dir=str(tmp_path))
    assert len(os.listdir(str(tmp_path))) == 1
    # Another run's zip, the same file inside it: the cached code, carrying the new path in every function.
    second = shim.cached_compile("/tmp/b/payload.zip/pkg/mod.py", source, cache_dir=str(tmp_path))
    assert len(os.listdir(str(tmp_path))) == 1
    func = [c for c in second.co_consts if hasattr(c, "co_code")][0]
    assert second.co_filename == func.co_filename == "/tmp/b/payload.zip/pkg/mod.py"
    assert first.co_code == second.co_code
    namespace = {}
    exec(second, namespace)
    assert namespace["answer"]() == 11303


def test_a_changed_source_or_a_damaged_cache_file_is_compiled_anew(shim, tmp_path):
    shim.cached_compile("/x.zip/mod.py", b"VALUE = 1\n", cache_dir=str(tmp_path))
    changed = shim.cached_compile("/x.zip/mod.py", b"VALUE = 2\n", cache_dir=str(tmp_path))
    namespace = {}
    exec(changed, namespace)
    assert namespace["VALUE"] == 2 and len(os.listdir(str(tmp_path))) == 2
    for name in os.listdir(str(tmp_path)):
        with open(os.path.join(str(tmp_path), name), "wb") as handle:
            handle.write(b"not marshal data")
    again = shim.cached_compile("/x.zip/mod.py", b"VALUE = 2\n", cache_dir=str(tmp_path))
    namespace = {}
    exec(again, namespace)
    assert namespace["VALUE"] == 2


def test_a_cache_file_others_can_write_is_never_loaded(shim, tmp_path):
    shim.cached_compile("/x.zip/mod.py", b"VALUE = 1\n", cache_dir=str(tmp_path))
    [name] = os.listdir(str(tmp_path))
    planted = os.path.join(str(tmp_path), name)
    with open(planted, "wb") as handle:
        handle.write(marshal.dumps(compile("VALUE = 666\n", "planted", "exec")))
    os.chmod(planted, 0o666)
    namespace = {}
    exec(shim.cached_compile("/x.zip/mod.py", b"VALUE = 1\n", cache_dir=str(tmp_path)), namespace)
    assert namespace["VALUE"] == 1


def test_a_process_importing_from_a_zip_fills_the_cache_only_when_asked(tmp_path):
    payload = os.path.join(str(tmp_path), "payload.zip")
    with zipfile.ZipFile(payload, "w") as archive:
        archive.writestr("zipped_mod.py", "VALUE = 127 * 89\n")
    cache = os.path.join(str(tmp_path), "cache")
    os.makedirs(cache)
    code = "import sys; sys.path.insert(0, %r); import zipped_mod; print(zipped_mod.VALUE)" % payload
    env = dict(os.environ, PYTHONPATH=SHIM_DIR)
    env.pop("MODULE_BUILD_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, check=True).stdout
    assert out.strip() == b"11303" and os.listdir(cache) == []
    env["MODULE_BUILD_CACHE"] = cache
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, check=True).stdout
        assert out.strip() == b"11303"
    assert len(os.listdir(cache)) == 1


# ------------------------------------------------------------------------------------------------
# the payload's module_utils (recursive_finder)
# ------------------------------------------------------------------------------------------------

MODULE = """from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.%s import ANSWER
AnsibleModule(argument_spec={}).exit_json(answer=ANSWER)
"""


@pytest.fixture
def finder(shim, tmp_path):
    """build() -> (zip bytes, metadata, whether Ansible's own recursive_finder ran), through the cache in
    tmp_path/cache, with tmp_path/module_utils/<helper>.py on the module_utils search path (a name of this
    test's own: the loader keeps every directory added in this process)."""
    from ansible.executor import module_common
    from ansible._internal._ansiballz import _builder
    from ansible.plugins.loader import init_plugin_loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # "already configured" when an earlier test did the same
        init_plugin_loader()    # what every Ansible command does first: the collection finder, for redirects

    helper = "dgx_test_helper_%s" % uuid.uuid4().hex[:8]
    utils = tmp_path / "module_utils"
    utils.mkdir()
    (utils / (helper + ".py")).write_text("ANSWER = 11303\n")
    module_common.module_utils_loader.add_directory(str(utils))
    cache = tmp_path / "cache"
    cache.mkdir()
    calls = []

    def original(*args):
        calls.append(args[0])
        return module_common.recursive_finder(*args)

    cached = shim.cached_recursive_finder(module_common, original, cache_dir=str(cache))
    module = (MODULE % helper).encode()
    when = datetime.datetime(2026, 12, 1)

    def build(through=cached):
        del calls[:]
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            metadata = through("dgx_test_module", "ansible.modules.dgx_test_module", module, zf, when,
                               _builder.ExtensionManager.create(task_vars={}))
        return out.getvalue(), metadata, bool(calls)

    build.helper = utils / (helper + ".py")
    build.entry = "ansible/module_utils/%s.py" % helper
    build.cache, build.uncached = cache, module_common.recursive_finder
    return build


def zip_entries(data):
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return dict((name, zf.read(name)) for name in zf.namelist())


def test_a_replayed_payload_is_byte_for_byte_what_ansible_builds(finder):
    expected, expected_meta, _ = finder(through=finder.uncached)
    assert zip_entries(expected)[finder.entry] == b"ANSWER = 11303\n"
    first, meta, ran = finder()
    assert ran and first == expected and meta == expected_meta
    assert len(os.listdir(str(finder.cache))) == 1
    again, meta, ran = finder()
    assert not ran, "the second build must come from the cache"
    assert again == expected and meta == expected_meta


def test_a_changed_module_util_is_found_anew(finder):
    finder()
    finder.helper.write_text("ANSWER = 42\n")
    changed, _meta, ran = finder()
    assert ran and zip_entries(changed)[finder.entry] == b"ANSWER = 42\n"
    assert changed == finder(through=finder.uncached)[0]


def test_a_finder_cache_file_others_can_write_is_never_loaded(finder):
    finder()
    [name] = os.listdir(str(finder.cache))
    os.chmod(str(finder.cache / name), 0o666)
    _data, _meta, ran = finder()
    assert ran


def test_a_module_util_added_where_the_search_finds_it_builds_anew(finder):
    """The helper imports a sibling only if it is there: the sibling appearing must change the payload."""
    sibling = finder.helper.with_name(finder.helper.stem + "_extra.py")
    finder.helper.write_text("try:\n    from ansible.module_utils.%s import X\nexcept ImportError:\n    X = None\n"
                             "ANSWER = 11303\n" % sibling.stem)
    without, _meta, _ran = finder()
    assert "ansible/module_utils/%s" % sibling.name not in zip_entries(without)
    sibling.write_text("X = 'present'\n")
    added, _meta, ran = finder()
    assert ran and zip_entries(added)["ansible/module_utils/%s" % sibling.name] == b"X = 'present'\n"
    assert added == finder(through=finder.uncached)[0]


def test_a_symlinked_or_misshapen_cache_entry_is_built_anew_and_no_link_is_written_through(shim, finder, tmp_path):
    finder()
    [name] = os.listdir(str(finder.cache))
    entry = finder.cache / name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(entry.read_bytes())       # a good entry, but reached through a link
    entry.unlink()
    entry.symlink_to(elsewhere)
    _data, _meta, ran = finder()
    assert ran
    entry.unlink()
    entry.write_bytes(pickle.dumps((None, [(1, 2)])))      # a well-formed pickle of the wrong shape
    data, _meta, ran = finder()
    assert ran and data == finder(through=finder.uncached)[0]
    # A link planted at the temp file's name is never written through.
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    planted = str(tmp_path / "cache" / "code") + ".%d.tmp" % os.getpid()
    os.symlink(str(victim), planted)
    shim.write_atomically(str(tmp_path / "cache" / "code"), b"payload")
    assert victim.read_bytes() == b"keep" and not os.path.exists(str(tmp_path / "cache" / "code"))


def test_a_cache_entry_of_the_wrong_type_is_compiled_over(shim, tmp_path):
    shim.cached_compile("/x.zip/mod.py", b"VALUE = 1\n", cache_dir=str(tmp_path))
    [name] = os.listdir(str(tmp_path))
    (tmp_path / name).write_bytes(marshal.dumps(1))
    namespace = {}
    exec(shim.cached_compile("/x.zip/mod.py", b"VALUE = 1\n", cache_dir=str(tmp_path)), namespace)
    assert namespace["VALUE"] == 1
