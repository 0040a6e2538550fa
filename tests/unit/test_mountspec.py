"""Bind paths: module_utils/dgx_mountspec.mount_path_problem and the engine role's filter plugin
(roles/engine/filter_plugins/engine_lane.py), which loads the same check and shapes the
Docker `mounts` list and the Podman `--mount` specs.

The Podman specs are read back with Python's csv module, which parses quoted fields the way Go's
encoding/csv (Podman >= 4.1) does; tests/integration/test_engine_one_rank.py binds real files with
these names on real Podman and Docker.
"""
import csv

import pytest
from ansible.errors import AnsibleFilterError
from pluginfile import load_filter

from ansible.module_utils.dgx_mountspec import PATH_MAX, mount_path_problem


plugin = load_filter("engine", "engine_lane")
FILTERS = plugin.FilterModule().filters()

SNAP = "/hub/models--org--name/snapshots/" + "a" * 40
# Names Podman (CSV-quoted where needed) and Docker bind exactly as written.
ACCEPTED_NAMES = [
    "config.json", "tok:v2.json", "a,b.json", "my file.json", "k=v.json", 'q"uote.json', 'q"".json',
    '"lead-quote.json', 'trail-quote.json"', " lead.json", "trail.json ", "\u00fcn\u00ef\u00a9\u00f8d\u00e9.json",
    "\u65e5\u672c.json", "back\\slash.json", "semi;colon.json", "'single'.json", "hash#.json", "dollar$x.json",
    "star*.json", "ro.json,ro", "x,readonly", "relabel=z", "bind-propagation=shared", 'a,b:c=d "e".json',
    "sub dir/x:y,z.json",
]
# (path, a word the reason must contain)
REFUSED = [
    (SNAP + "/nl\nname.json", "newline"),
    (SNAP + "/crlf\r\nname.json", "carriage return"),
    (SNAP + "/trailcr\r", "carriage return"),
    (SNAP + "/tab\tname.json", "tab"),
    (SNAP + "/nul\x00name.json", "NUL"),
    (SNAP + "/del\x7fname.json", "DEL"),
    (SNAP + "/bell\x07name.json", "U+0007"),
    (SNAP + "/bad\udcffutf8.json", "UTF-8"),
    ("hub/relative.json", "absolute"),
    ("", "empty"),
    ("//hub/x.json", "normal form"),
    ("/hub//x.json", "normal form"),
    ("/hub/x.json/", "normal form"),
    ("/hub/./x.json", "normal form"),
    ("/hub/sub/../x.json", "normal form"),
    ("/" + "d" * 200 + ("/" + "e" * 250) * 16, "PATH_MAX"),
]


def accepted_paths():
    return [SNAP + "/" + name for name in ACCEPTED_NAMES] + ["/", "/cache", "/" + "d" * (PATH_MAX - 2)]


@pytest.mark.parametrize("path", accepted_paths())
def test_names_both_runtimes_bind_exactly_are_accepted(path):
    assert mount_path_problem(path) is None


@pytest.mark.parametrize("path,word", REFUSED)
def test_paths_no_runtime_binds_exactly_are_refused_naming_the_path_and_why(path, word):
    problem = mount_path_problem(path)
    assert problem is not None and word in problem, problem
    if len(path) < 200:
        assert problem.startswith(repr(path)), problem  # control characters show as escapes


@pytest.mark.parametrize("value", [None, b"/hub/x.json", 42])
def test_non_text_is_refused(value):
    assert "not a text path" in mount_path_problem(value)


def test_normal_form_problem_says_what_the_runtime_would_bind():
    assert "'/hub/x.json'" in mount_path_problem("/hub/sub/../x.json")
    assert "'/hub/x.json'" in mount_path_problem("//hub/x.json")


def test_the_filter_plugin_refuses_with_module_utils_check():
    for path, _word in REFUSED:
        with pytest.raises(AnsibleFilterError) as raised:
            FILTERS["dgx_binds"]([{"source": "/nvme/hub/x", "target": path}])
        assert mount_path_problem(path) in str(raised.value), repr(path)


def binds_for(names, read_only=True):
    return [{"source": "/nvme/hub/" + name, "target": SNAP + "/" + name, "read_only": read_only} for name in names]


def parse_spec(spec):
    """A --mount value as encoding/csv reads it: {key: value} of its key=value fields."""
    fields = next(csv.reader([spec], strict=True))
    parsed = {}
    for field in fields:
        key, _, value = field.partition("=")
        assert key not in parsed, (key, spec)
        parsed[key] = value
    return parsed


def test_podman_specs_read_back_to_the_exact_paths():
    binds = binds_for(ACCEPTED_NAMES)
    specs = FILTERS["dgx_podman_mount_specs"](binds)
    assert len(specs) == len(binds)
    for bind, spec in zip(binds, specs):
        assert parse_spec(spec) == {"type": "bind", "source": bind["source"], "destination": bind["target"],
                                    "ro": "true"}, spec


def test_podman_specs_quote_only_fields_that_need_it():
    specs = FILTERS["dgx_podman_mount_specs"](
        [{"source": "/s/tok:v2.json", "target": "/t/tok:v2.json", "read_only": True},
         {"source": "/s/a,b.json", "target": "/t/my file.json", "read_only": True},
         {"source": '/s/q"uote.json', "target": "/t/trail ", "read_only": False}])
    assert specs == [
        "type=bind,source=/s/tok:v2.json,destination=/t/tok:v2.json,ro=true",
        'type=bind,"source=/s/a,b.json",destination=/t/my file.json,ro=true',
        'type=bind,"source=/s/q""uote.json","destination=/t/trail ",ro=false',
    ]


def test_docker_mounts_carry_the_same_names_unchanged():
    binds = binds_for(ACCEPTED_NAMES) + [{"source": "/cache", "target": "/cache", "read_only": False}]
    mounts = FILTERS["dgx_docker_mounts"](binds)
    assert mounts == [{"type": "bind", "source": b["source"], "target": b["target"], "read_only": b["read_only"]}
                      for b in binds]
    assert type(mounts[0]["source"]) is str


def test_binds_are_the_manifest_read_only_then_the_extra_binds():
    manifest = [{"source": "/nvme/hub/tok:v2.json", "target": SNAP + "/tok:v2.json", "read_only": True,
                 "origin": "local"},
                {"source": "/nas/hub/page 15,x", "target": SNAP + "/page 15,x", "read_only": False, "origin": "nas"}]
    extra = [{"source": "/cache", "target": "/cache", "read_only": False}]
    assert FILTERS["dgx_binds"](manifest, extra) == [
        {"source": "/nvme/hub/tok:v2.json", "target": SNAP + "/tok:v2.json", "read_only": True},
        {"source": "/nas/hub/page 15,x", "target": SNAP + "/page 15,x", "read_only": True},
        {"source": "/cache", "target": "/cache", "read_only": False},
    ]
    assert FILTERS["dgx_binds"](manifest[:1], []) == FILTERS["dgx_binds"](manifest[:1])


@pytest.mark.parametrize("name", ["dgx_binds", "dgx_docker_mounts", "dgx_podman_mount_specs"])
@pytest.mark.parametrize("key", ["source", "target"])
@pytest.mark.parametrize("path,word", [(p, w) for p, w in REFUSED if len(p) < 200])
def test_every_filter_refuses_what_the_manifest_module_refuses(name, key, path, word):
    bind = {"source": "/nvme/hub/ok.json", "target": SNAP + "/ok.json", "read_only": True}
    bind[key] = path
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS[name](binds_for(["fine.json"]) + [bind])
    message = str(err.value)
    assert "bind 1 refused, its %s %r" % (key, path) in message and word in message, message


def test_malformed_binds_fail_clearly():
    with pytest.raises(AnsibleFilterError, match="expected a list"):
        FILTERS["dgx_podman_mount_specs"]({"source": "/a", "target": "/b"})
    with pytest.raises(AnsibleFilterError, match="not a dict"):
        FILTERS["dgx_docker_mounts"](["/a:/b"])
    with pytest.raises(AnsibleFilterError, match="not a boolean"):
        FILTERS["dgx_docker_mounts"]([{"source": "/a", "target": "/b", "read_only": "yes"}])
    with pytest.raises(AnsibleFilterError, match="its source None"):
        FILTERS["dgx_binds"]([{"target": "/b"}])


def test_digest_is_exact_where_podman_container_compares_lowercased():
    digest = FILTERS["dgx_mounts_digest"]
    lower = FILTERS["dgx_podman_mount_specs"](binds_for(["tok.json"]))
    upper = FILTERS["dgx_podman_mount_specs"](binds_for(["Tok.json"]))
    assert [s.lower() for s in lower] == [s.lower() for s in upper]
    assert digest(lower) != digest(upper)
    assert digest(lower) == digest(list(lower)) and len(digest(lower)) == 64
    assert digest(["a,b", "c"]) != digest(["a", "b,c"])
