"""Compile each module source imported from a zip once per test run, not once per process.

Ansible runs every module task as a fresh Python process importing the module and its module_utils from
the AnsiballZ zip, which holds sources only: each task compiles them again, about a fifth of an integration
run's CPU. `make integration` puts this directory on PYTHONPATH and names a cache directory in
ZIP_BYTECODE_CACHE; zipimport's compile step then keeps the code object there, keyed by the interpreter,
the path inside the zip and the source bytes, so a changed source is compiled anew. Without the variable
nothing changes. The cached code gets the file name of the zip that imports it, so tracebacks stay true.
"""
import hashlib
import marshal
import os
import sys
import types
import zipimport

CACHE_DIR = os.environ.get("ZIP_BYTECODE_CACHE")
_compile_source = getattr(zipimport, "_compile_source", None)


def cache_key(pathname, source):
    inner = pathname.rsplit(".zip", 1)[-1]
    return hashlib.sha256(b"\0".join([sys.version.encode(), inner.encode(), source])).hexdigest()


def with_filename(code, filename):
    consts = tuple(with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def trusted(handle):
    """Code is only loaded from a file this user or root wrote and no one else can change."""
    st = os.fstat(handle.fileno())
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def cached_compile(pathname, source, cache_dir=None):
    path = os.path.join(cache_dir or CACHE_DIR, cache_key(pathname, source))
    try:
        with open(path, "rb") as handle:
            if trusted(handle):
                return with_filename(marshal.loads(handle.read()), pathname)
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = _compile_source(pathname, source)
    try:
        temp = "%s.%d.tmp" % (path, os.getpid())
        with open(temp, "wb") as handle:
            handle.write(marshal.dumps(code))
        os.replace(temp, path)
    except OSError:
        pass            # a read-only or foreign cache directory: compile every time, as without the cache
    return code


if CACHE_DIR and _compile_source is not None and os.path.isdir(CACHE_DIR):
    zipimport._compile_source = cached_compile
