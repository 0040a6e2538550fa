"""requirements.yml (for Galaxy sites) pins the same collection versions the pinned `ansible`
package bundles, which is what every test here runs against."""
import json
import os
import subprocess
import sys

import yaml

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_requirements_yml_matches_the_bundled_collections():
    with open(os.path.join(REPO_ROOT, "requirements.yml")) as handle:
        pinned = dict((c["name"], c["version"]) for c in yaml.safe_load(handle)["collections"])
    galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    out = subprocess.run([galaxy, "collection", "list", "--format", "json"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, check=True).stdout
    installed = {}
    for collections in json.loads(out).values():
        for name, info in collections.items():
            installed.setdefault(name, info["version"])
    assert pinned and dict((n, installed.get(n)) for n in pinned) == pinned
