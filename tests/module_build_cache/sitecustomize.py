"""Build each Ansible module payload, and compile each module source, once per test run, not once per process.

`make integration` puts this directory on PYTHONPATH and names a cache directory in MODULE_BUILD_CACHE.
Without the variable nothing changes. Two steps of every playbook run repeat the same work each time:

- In each module process, zipimport compiles the module and its module_utils from the AnsiballZ zip, which
  holds sources only (about a fifth of an integration run's CPU). The code object is kept, keyed by the
  interpreter, the path inside the zip and the source bytes, so a changed source is compiled anew; cached
  code gets the file name of the zip that imports it, so tracebacks stay true.
- On the controller, each run finds a module's module_utils by parsing every one of them
  (`recursive_finder`: Ansible keeps the result for one run only, about a sixth of a run's CPU). The files
  it put in the zip are kept, keyed by the module's source and the module_utils search path with every file
  below it, and with the hash of every file they were read from: when any of those changed, or a file was
  added where the search could find it, the payload is built anew. A replay writes the same entries, so the
  payload is byte for byte what Ansible builds.

Cache files are loaded only when this user or root wrote them, in a directory no one else can write, never
through a symlink; temp files are always new files.
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


def trusted_dir(path):
    """A cache directory no one but this user or root can add files to (no symlink to one elsewhere)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return os.path.isdir(path) and not os.path.islink(path) and st.st_uid in (0, os.geteuid()) \
        and not st.st_mode & 0o022


def read_trusted(path):
    """The bytes of a cache file that trusted() accepts, in a trusted_dir(), never through a symlink; or None."""
    if not trusted_dir(os.path.dirname(path)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read() if trusted(handle) else None


def write_atomically(path, data):
    """path written whole or not at all; its temp file is made new (never a link or file already there)."""
    if not trusted_dir(os.path.dirname(path)):
        return
    temp = "%s.%d.tmp" % (path, os.getpid())
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return          # a read-only or foreign cache directory: build every time, as without the cache
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass


def cached_compile(pathname, source, cache_dir=None):
    path = os.path.join(cache_dir or CACHE_DIR, cache_key(pathname, source))
    data = read_trusted(path)
    if data is not None:
        try:
            code = marshal.loads(data)
            if isinstance(code, type(with_filename.__code__)):
                return with_filename(code, pathname)
        except (ValueError, EOFError, TypeError):
            pass
    code = _compile_source(pathname, source)
    write_atomically(path, marshal.dumps(code))
    return code


def listing(paths):
    """(path, size, mtime) of everything below paths: a module_util added, removed or replaced changes it."""
    out = []
    for top in paths:
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                out.append((os.path.join(root, name), st.st_size, st.st_mtime_ns))
    return out


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
        # The key holds what the search could find: every file below the search path (Ansible's own
        # module_utils aside: its version is in the key), so a module_util added in front of another, or one an
        # optional import now finds, builds anew. The installed collections are fixed for one cache directory
        # (make integration names it by the hash of requirements.txt).
        own = os.path.realpath(module_common._MODULE_UTILS_PATH)
        found = listing(p for p in search if os.path.realpath(p) != own)
        key = hashlib.sha256(repr((sys.version, module_common.__version__, name, module_fqn, search, found,
                                   list(extension_manager.module_names))).encode() + b"\0" + bytes(module_data))
        path = os.path.join(cache_dir or CACHE_DIR, "finder-" + key.hexdigest())
        replay = None
        data = read_trusted(path)
        if data is not None:
            try:
                metadata, entries = pickle.loads(data)
                if all(isinstance(f, str) and isinstance(src, (bytes, str)) and (not o or sha256_of(o) == d)
                       for f, src, o, d in entries):
                    replay = [(f, src) for f, src, _o, _d in entries]
            except Exception:
                replay = None   # a damaged entry: built anew
        if replay is not None:
            for filename, source in replay:
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
