"""scripts/install-collections.py: only the pinned collections come out of the `ansible` wheel, each at its pinned
version, or nothing is written."""
import importlib.util
import json
import os
import zipfile

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = importlib.util.spec_from_file_location("install_collections",
                                              os.path.join(REPO_ROOT, "scripts", "install-collections.py"))
install_collections = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(install_collections)


def fake_wheel(path, versions):
    """A wheel laid out like the `ansible` package's: ansible_collections/<ns>/<name>/{MANIFEST.json,plugins/...}."""
    with zipfile.ZipFile(str(path), "w") as archive:
        for fqcn, version in versions.items():
            namespace, name = fqcn.split(".")
            base = "ansible_collections/%s/%s/" % (namespace, name)
            archive.writestr(base + "MANIFEST.json", json.dumps({"collection_info": {"version": version}}))
            archive.writestr(base + "plugins/modules/thing.py", "# %s %s\n" % (fqcn, version))
        archive.writestr("ansible_collections/ansible_release.py", "")
    return str(path)


def test_only_the_pinned_collections_are_unpacked_an_older_copy_is_replaced_and_an_unpinned_one_removed(tmp_path):
    wheel = fake_wheel(tmp_path / "ansible.whl", {"community.docker": "4.8.5", "community.general": "11.4.2"})
    target = tmp_path / "site" / "ansible_collections"
    (target / "community" / "docker" / "stale").mkdir(parents=True)
    (target / "community" / "general" / "plugins").mkdir(parents=True)   # pinned once, not any more
    (target / "retired" / "old").mkdir(parents=True)
    install_collections.install(wheel, [("community", "docker", "4.8.5")], str(target))
    assert sorted(os.listdir(str(target))) == ["community"]
    assert sorted(os.listdir(str(target / "community"))) == ["docker"]
    docker = target / "community" / "docker"
    assert sorted(os.listdir(str(docker))) == ["MANIFEST.json", "plugins"]
    assert (docker / "plugins" / "modules" / "thing.py").read_text() == "# community.docker 4.8.5\n"
    assert sorted(os.listdir(str(tmp_path / "site"))) == ["ansible_collections"]


def test_a_run_killed_between_its_renames_leaves_no_half_collection_and_the_next_run_sweeps_up(tmp_path, monkeypatch):
    wheel = fake_wheel(tmp_path / "ansible.whl", {"community.docker": "4.8.5", "ansible.posix": "2.1.0"})
    target = tmp_path / "site" / "ansible_collections"
    pins = [("ansible", "posix", "2.1.0"), ("community", "docker", "4.8.5")]
    install_collections.install(wheel, pins, str(target))
    renames = []
    real_rename = os.rename

    def killed_at_the_fourth_rename(src, dst):
        renames.append(src)
        if len(renames) == 4:
            raise KeyboardInterrupt   # what a kill at that instant leaves, minus the staging clean-up
        real_rename(src, dst)

    monkeypatch.setattr(install_collections.os, "rename", killed_at_the_fourth_rename)
    monkeypatch.setattr(install_collections.shutil, "rmtree", lambda *args, **kwargs: None)
    with pytest.raises(KeyboardInterrupt):
        install_collections.install(wheel, pins, str(target))
    monkeypatch.undo()
    # posix was swapped whole; docker was moved aside, not yet back: absent, never half there.
    assert sorted(os.listdir(str(target / "ansible" / "posix"))) == ["MANIFEST.json", "plugins"]
    assert not os.path.lexists(str(target / "community" / "docker"))
    assert [n for n in os.listdir(str(tmp_path / "site")) if n.startswith(".dgx-collections-")]
    assert not [n for n in os.listdir(str(target)) if n.startswith(".")]
    install_collections.install(wheel, pins, str(target))
    assert sorted(os.listdir(str(target / "community" / "docker"))) == ["MANIFEST.json", "plugins"]
    assert sorted(os.listdir(str(tmp_path / "site"))) == ["ansible_collections"]


def test_a_damaged_wheel_is_refused_before_anything_is_written_or_uninstalled(tmp_path):
    wheel = fake_wheel(tmp_path / "ansible.whl", {"community.docker": "4.8.5", "ansible.posix": "2.1.0"})
    data = bytearray((tmp_path / "ansible.whl").read_bytes())
    spot = data.index(b"# ansible.posix 2.1.0")
    data[spot] ^= 0xFF   # a flipped byte in the last collection's files: its CRC no longer matches
    (tmp_path / "ansible.whl").write_bytes(bytes(data))
    target = tmp_path / "site" / "ansible_collections"
    (target / "community" / "docker").mkdir(parents=True)
    (target / "community" / "docker" / "MANIFEST.json").write_text("{}")
    written = []
    with pytest.raises(SystemExit) as refused:
        install_collections.install(wheel, [("community", "docker", "4.8.5"), ("ansible", "posix", "2.1.0")],
                                    str(target), before_writing=lambda: written.append("uninstall"))
    assert "ansible.whl is damaged" in str(refused.value) and "delete it and run make setup again" in str(refused.value)
    assert written == []
    assert sorted(os.listdir(str(target / "community" / "docker"))) == ["MANIFEST.json"]


@pytest.mark.parametrize("pins, said", [
    ([("community", "docker", "4.8.5"), ("containers", "podman", "1.18.0")], "containers.podman is not in"),
    ([("community", "docker", "4.8.5"), ("ansible", "posix", "2.2.0")], "pins ansible.posix 2.2.0, but"),
])
def test_a_collection_missing_from_the_wheel_or_at_another_version_is_refused_before_anything_is_written(
        tmp_path, pins, said):
    wheel = fake_wheel(tmp_path / "ansible.whl", {"community.docker": "4.8.5", "ansible.posix": "2.1.0"})
    target = tmp_path / "site" / "ansible_collections"
    with pytest.raises(SystemExit) as refused:
        install_collections.install(wheel, pins, str(target))
    assert said in str(refused.value)
    assert not target.exists()


def test_the_pins_are_read_from_requirements_yml():
    pins = install_collections.pinned_collections(os.path.join(REPO_ROOT, "requirements.yml"))
    assert ("community", "docker", "4.8.5") in pins and all(len(p) == 3 for p in pins)


@pytest.mark.parametrize("entry", ['{name: community.docker, version: 4.10}', '{name: docker, version: "4.8.5"}',
                                   '{name: a.b.c, version: "1"}', '{version: "1"}'])
def test_a_pin_without_a_namespaced_name_or_a_quoted_version_is_refused_naming_the_file(tmp_path, entry):
    requirements = tmp_path / "requirements.yml"
    requirements.write_text("collections:\n  - %s\n" % entry)
    with pytest.raises(SystemExit) as refused:
        install_collections.pinned_collections(str(requirements))
    assert str(requirements) in str(refused.value) and "quoted version" in str(refused.value)


def test_a_cached_wheel_that_is_not_a_whole_zip_is_downloaded_again_and_replaced_whole(tmp_path, monkeypatch):
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    cached = wheel_dir / "ansible-12.3.0-py3-none-any.whl"
    cached.write_bytes(b"PK\x03\x04 cut short by a killed download")
    downloads = []

    def pip_download_stand_in(argv):
        dest = argv[argv.index("--dest") + 1]
        downloads.append(dest)
        assert os.path.dirname(dest) == str(wheel_dir) and not os.listdir(dest)
        fake_wheel(os.path.join(dest, cached.name), {"community.docker": "4.8.5"})

    monkeypatch.setattr(install_collections.subprocess, "check_call", pip_download_stand_in)
    assert install_collections.bundle_wheel("12.3.0", str(wheel_dir)) == str(cached)
    assert len(downloads) == 1 and zipfile.is_zipfile(str(cached))
    assert sorted(os.listdir(str(wheel_dir))) == [cached.name]
    # A whole wheel is taken as it is.
    assert install_collections.bundle_wheel("12.3.0", str(wheel_dir)) == str(cached) and len(downloads) == 1


def test_a_download_that_brings_no_wheel_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(install_collections.subprocess, "check_call", lambda argv: None)
    with pytest.raises(SystemExit) as refused:
        install_collections.bundle_wheel("12.3.0", str(tmp_path))
    assert "downloaded no wheel ansible-12.3.0-py3-none-any.whl" in str(refused.value)
    assert os.listdir(str(tmp_path)) == []
