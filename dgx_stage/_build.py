"""The package's own PEP 517/660 build backend (pyproject.toml: backend-path ["."]), standard library only.

setuptools builds wheels only with the `wheel` package, which a fresh venv lacks and requirements.txt does
not pin; this backend needs nothing, so `pip install --no-build-isolation -e .` works offline (`make setup`).
An editable wheel holds a .pth line importing a finder that maps only `dgx_stage` to the repo (the repo's
other directories stay off sys.path); a regular wheel holds the package's files. Both carry the console
script `dgx-stage` as an entry point, which pip turns into .venv/bin/dgx-stage.
"""
import base64
import hashlib
import io
import os
import tarfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "dgx_stage"

FINDER = '''"""Editable install of dgx-stage: `import dgx_stage` finds the package in its repo."""
import importlib.machinery
import sys

ROOT = %r


class DgxStageFinder(object):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != %r:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [ROOT])


if DgxStageFinder not in sys.meta_path:
    sys.meta_path.append(DgxStageFinder)
'''


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)["project"]


def _dist_name(project):
    return project["name"].replace("-", "_")


def _metadata(project):
    lines = ["Metadata-Version: 2.1", "Name: %s" % project["name"], "Version: %s" % project["version"],
             "Summary: %s" % project.get("description", ""), "Requires-Python: %s" % project["requires-python"]]
    lines += ["Requires-Dist: %s" % dep for dep in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _entry_points(project):
    scripts = project.get("scripts", {})
    return "[console_scripts]\n" + "".join("%s = %s\n" % item for item in sorted(scripts.items()))


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _package_files():
    """(archive name, bytes) of the package's Python files."""
    base = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(base)):
        if name.endswith(".py"):
            with open(os.path.join(base, name), "rb") as handle:
                yield "%s/%s" % (PACKAGE, name), handle.read()


def _write_wheel(wheel_directory, files):
    project = _project()
    dist = "%s-%s" % (_dist_name(project), project["version"])
    info = dist + ".dist-info"
    files = list(files) + [
        (info + "/METADATA", _metadata(project).encode()),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: dgx_stage._build\nRoot-Is-Purelib: true\n"
                          b"Tag: py3-none-any\n"),
        (info + "/entry_points.txt", _entry_points(project).encode()),
        (info + "/top_level.txt", (PACKAGE + "\n").encode()),
    ]
    record = "".join(_record_line(name, data) + "\n" for name, data in files) + info + "/RECORD,,\n"
    filename = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            wheel.writestr(name, data)
        wheel.writestr(info + "/RECORD", record)
    return filename


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    finder = FINDER % (ROOT, PACKAGE)
    return _write_wheel(wheel_directory, [("_dgx_stage_editable.py", finder.encode()),
                                          ("_dgx_stage_editable.pth", b"import _dgx_stage_editable\n")])


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = "%s-%s" % (_dist_name(project), project["version"])
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as sdist:
        members = [("pyproject.toml", open(os.path.join(ROOT, "pyproject.toml"), "rb").read())]
        members += list(_package_files())
        members.append(("PKG-INFO", _metadata(project).encode()))
        for name, data in members:
            entry = tarfile.TarInfo("%s/%s" % (base, name))
            entry.size = len(data)
            entry.mode = 0o644
            sdist.addfile(entry, io.BytesIO(data))
    return filename
