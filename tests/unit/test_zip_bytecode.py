"""tests/zip_bytecode/sitecustomize.py: a module compiled from a zip once per run, its code still true."""
import importlib.util
import marshal
import os
import subprocess
import sys
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_DIR = os.path.join(os.path.dirname(HERE), "zip_bytecode")


@pytest.fixture
def shim():
    spec = importlib.util.spec_from_file_location("zip_bytecode_shim", os.path.join(SHIM_DIR, "sitecustomize.py"))
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
    env.pop("ZIP_BYTECODE_CACHE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, check=True).stdout
    assert out.strip() == b"11303" and os.listdir(cache) == []
    env["ZIP_BYTECODE_CACHE"] = cache
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, check=True).stdout
        assert out.strip() == b"11303"
    assert len(os.listdir(cache)) == 1
