"""Build each Ansible module payload, and compile each module source, once per test run, not once per process.

`make integration` puts this directory on PYTHONPATH and names a cache directory in MODULE_BUILD_CACHE.
Without the variable nothing changes. Two steps of every playbook run repeat the same work each time:

- In each module process, zipimport compiles the module and its module_utils from the AnsiballZ zip, which
  holds sources only (about a fifth of an integration run's CPU). The code object is kept, keyed by the
  interpreter, the path inside the zip and the source bytes, so a changed source is compiled anew; cached
  code gets the file name of the zip that imports it, so tracebacks stay true.
- On the controller, each run finds a module's module_utils by parsing every one of them
  (`recursive_finder`: Ansible keeps the result for one run only, about a sixth of a run's CPU). The files
  it put in the zip are kept, keyed by the module's source and the module_utils search path, with the
  hash of every file they were read from: when any of those changed, the payload is built anew. A replay
  writes the same entries, so the payload is byte for byte what Ansible builds.

Cache files are loaded only when this user or root wrote them and no one else can change them.
"""
# Every Python process of the run imports this file: what only some of them need is imported where it is used.
import marshal
import os
import sys
import zipimport

CACHE_DIR = os.environ.get("MODULE_BUILD_CACHE")
_compile_source = getattr(zipimport, "_compile_source", None)


def cache_key(pathname, source):
    import hashlib
    inner = pathname.rsplit(".zip", 1)[-1]
    return hashlib.sha256(b"\0".join([sys.version.encode(), inner.encode(), source])).hexdigest()


def with_filename(code, filename):
    consts = tuple(with_filename(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def trusted(handle):
    """Code is only loaded from a file this user or root wrote and no one else can change."""
    st = os.fstat(handle.fileno())
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def read_trusted(path):
    """The bytes of a cache file that trusted() accepts, or None."""
    try:
        with open(path, "rb") as handle:
            return handle.read() if trusted(handle) else None
    except OSError:
        return None


def write_atomically(path, data):
    try:
        temp = "%s.%d.tmp" % (path, os.getpid())
        with open(temp, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except OSError:
        pass            # a read-only or foreign cache directory: build every time, as without the cache


def cached_compile(pathname, source, cache_dir=None):
    path = os.path.join(cache_dir or CACHE_DIR, cache_key(pathname, source))
    data = read_trusted(path)
    if data is not None:
        try:
            return with_filename(marshal.loads(data), pathname)
        except (ValueError, EOFError, TypeError):
            pass
    code = _compile_source(pathname, source)
    write_atomically(path, marshal.dumps(code))
    return code


def sha256_of(path):
    import hashlib
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


class RecordingZip(object):
    """The payload zip as recursive_finder sees it: every entry written is also noted."""

    def __init__(self, zf):
        self._zf = zf
        self.entries = []

    def writestr(self, zinfo, data, *args, **kwargs):
        self.entries.append((zinfo.filename, data))
        return self._zf.writestr(zinfo, data, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._zf, name)


def cached_recursive_finder(module_common, original, cache_dir=None):
    """module_common.recursive_finder, keeping what it wrote for the next run (see the module docstring)."""
    import hashlib
    import pickle

    def recursive_finder(name, module_fqn, module_data, zf, date_time, extension_manager):
        if extension_manager.debugger_enabled:          # it also fills a source map: nothing to replay
            return original(name, module_fqn, module_data, zf, date_time, extension_manager)
        search = [p for p in module_common.module_utils_loader._get_paths(subdirs=False) if os.path.isdir(p)]
        key = hashlib.sha256(repr((sys.version, module_common.__version__, name, module_fqn, search,
                                   list(extension_manager.module_names))).encode() + b"\0" + bytes(module_data))
        path = os.path.join(cache_dir or CACHE_DIR, "finder-" + key.hexdigest())
        data = read_trusted(path)
        if data is not None:
            try:
                metadata, entries = pickle.loads(data)
            except Exception:
                metadata, entries = None, None
            if entries is not None and all(sha256_of(origin) == digest for _, _, origin, digest in entries if origin):
                for filename, source, _origin, _digest in entries:
                    zf.writestr(module_common._make_zinfo(filename, date_time, zf=zf), source)
                return metadata
        recording = RecordingZip(zf)
        metadata = original(name, module_fqn, module_data, recording, date_time, extension_manager)
        entries = []
        for filename, source in recording.entries:
            origin = module_common.Origin.get_tag(source)
            origin = origin.path if origin is not None else None
            # Without an origin, an entry is made by Ansible itself (an empty package, a redirect), the same
            # for one Ansible version; one read from a file is replayed only while that file is unchanged.
            plain = bytes(source) if isinstance(source, bytes) else str(source)
            digest = hashlib.sha256(plain if isinstance(plain, bytes) else plain.encode()).hexdigest()
            if origin and sha256_of(origin) != digest:
                return metadata                          # not read whole from its file: never replayed
            entries.append((filename, plain, origin, digest if origin else None))
        write_atomically(path, pickle.dumps((metadata, entries)))
        return metadata

    return recursive_finder


class PatchOnImport(object):
    """Wraps recursive_finder when ansible.executor.module_common is imported (only the controller does)."""

    NAME = "ansible.executor.module_common"

    def find_spec(self, name, path=None, target=None):
        if name != self.NAME:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            module.recursive_finder = cached_recursive_finder(module, module.recursive_finder)

        spec.loader.exec_module = exec_and_patch
        return spec


if CACHE_DIR and os.path.isdir(CACHE_DIR):
    if _compile_source is not None:
        zipimport._compile_source = cached_compile
    sys.meta_path.insert(0, PatchOnImport())
