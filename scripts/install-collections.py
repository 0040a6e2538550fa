"""Install the collections requirements.yml pins into this venv from the `ansible` package's wheel, without Galaxy.

Installing the package writes some 36,000 files; this unpacks only the pinned collections, each checked against its
pin, into site-packages, where Ansible, ansible-lint and Molecule find them.

    .venv/bin/python scripts/install-collections.py ANSIBLE_VERSION REQUIREMENTS_YML WHEEL_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

import yaml


def pinned_collections(requirements):
    """[(namespace, name, version)] of a Galaxy requirements file's collections."""
    with open(requirements) as handle:
        data = yaml.safe_load(handle) or {}
    out = []
    for entry in data.get("collections") or []:
        parts = str(entry.get("name", "")).split(".")
        version = entry.get("version")
        # YAML reads an unquoted 1.10 as the number 1.1: only a quoted version says what was meant.
        if len(parts) != 2 or not all(parts) or not isinstance(version, str):
            raise SystemExit("install-collections: %s: each collection needs name: namespace.name and a quoted "
                             "version, as in name: community.docker, version: \"4.8.5\" (found %r)"
                             % (requirements, entry))
        out.append((parts[0], parts[1], version))
    return out


def bundle_wheel(version, wheel_dir):
    """The path of the ansible==version wheel in wheel_dir, downloaded when missing or not a whole zip file."""
    path = os.path.join(wheel_dir, "ansible-%s-py3-none-any.whl" % version)
    if os.path.isfile(path) and zipfile.is_zipfile(path):
        return path
    os.makedirs(wheel_dir, exist_ok=True)
    # Downloaded beside its final place and renamed: a killed download leaves no half wheel behind.
    staging = tempfile.mkdtemp(prefix=".download-", dir=wheel_dir)
    try:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                               ":all:", "--dest", staging, "ansible==%s" % version])
        downloaded = os.path.join(staging, os.path.basename(path))
        if not zipfile.is_zipfile(downloaded):
            raise SystemExit("install-collections: pip downloaded no wheel %s" % os.path.basename(path))
        os.replace(downloaded, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


STAGING_PREFIX = ".dgx-collections-"


def check_wheel(archive, wheel, collections):
    """The wheel's files of the pinned collections, each read whole so a damaged wheel fails before any write."""
    names = archive.namelist()
    members = []
    for namespace, name, version in collections:
        prefix = "ansible_collections/%s/%s/" % (namespace, name)
        manifest = prefix + "MANIFEST.json"
        if manifest not in names:
            raise SystemExit("install-collections: %s.%s is not in %s: pin a collection that release bundles "
                             "in requirements.yml, or another release in the Makefile" % (namespace, name, wheel))
        bundled = json.loads(archive.read(manifest).decode("utf-8"))["collection_info"]["version"]
        if bundled != version:
            raise SystemExit("install-collections: requirements.yml pins %s.%s %s, but %s bundles %s: make "
                             "the two agree" % (namespace, name, version, os.path.basename(wheel), bundled))
        members += [n for n in names if n.startswith(prefix)]
    try:
        for member in members:
            archive.read(member)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SystemExit("install-collections: %s is damaged (%s): delete it and run make setup again"
                         % (wheel, exc))
    return members


def install(wheel, collections, target, before_writing=lambda: None):
    """Make target/<namespace>/<name> hold exactly the pinned collections (unpinned ones go), checked whole before
    before_writing() and any write. Staged beside target (Ansible reads a folder in it as a namespace) and swapped
    in by renames: a killed run leaves each collection whole or absent, and the next run sweeps up."""
    with zipfile.ZipFile(wheel) as archive:
        members = check_wheel(archive, wheel, collections)
        before_writing()
        site = os.path.dirname(os.path.abspath(target))
        os.makedirs(site, exist_ok=True)
        for leftover in os.listdir(site):
            if leftover.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(site, leftover), ignore_errors=True)
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=site)
        try:
            archive.extractall(staging, members)
            aside = os.path.join(staging, "replaced")
            os.makedirs(aside)
            pinned = set((namespace, name) for namespace, name, _version in collections)
            for namespace in _dirs(target):
                for name in _dirs(os.path.join(target, namespace)):
                    if (namespace, name) not in pinned:
                        os.rename(os.path.join(target, namespace, name), os.path.join(aside, namespace + "." + name))
                if not os.listdir(os.path.join(target, namespace)):
                    os.rmdir(os.path.join(target, namespace))
            for namespace, name in sorted(pinned):
                final = os.path.join(target, namespace, name)
                os.makedirs(os.path.dirname(final), exist_ok=True)
                if os.path.lexists(final):
                    os.rename(final, os.path.join(aside, namespace + "." + name))
                os.rename(os.path.join(staging, "ansible_collections", namespace, name), final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _dirs(path):
    """The names of the real directories in path ([] when path is missing)."""
    try:
        return sorted(entry.name for entry in os.scandir(path) if entry.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []


def uninstall_bundle():
    """A venv set up before this script holds the whole `ansible` package: its files go (pip knows them)."""
    subprocess.call([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "ansible"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    version, requirements, wheel_dir = argv
    collections = pinned_collections(requirements)
    wheel = bundle_wheel(version, wheel_dir)
    install(wheel, collections, os.path.join(sysconfig.get_paths()["purelib"], "ansible_collections"),
            before_writing=uninstall_bundle)
    print("install-collections: %s from ansible %s" % (", ".join("%s.%s %s" % c for c in collections), version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
