"""The read-only synthetic NAS hub every suite stages from: one wrapper for the unit and the
integration tests.

The NAS is read-only to every node. The tests run as root, where `chmod a-w` stops nothing, so the
hub is also snapshotted whole (path, lstat, link text, sha256 of content) and compared after use:
a single changed byte or inode attribute fails the test.
"""
import os

import hubgen
from treestate import set_writable, snapshot_diff, tree_snapshot


class NasHub(dict):
    """hubgen's description of a hub (plus "root", the directory it was built in), kept read-only."""

    def freeze(self):
        """Make the tree read-only and (re-)take the snapshot it is compared against, e.g. after a test
        deliberately planted a trap in it."""
        set_writable(self["root"], False)
        self.frozen = tree_snapshot(self["root"])

    def thaw(self):
        """Writable again: to plant a trap (then freeze), or to let the tree be removed."""
        set_writable(self["root"], True)

    def assert_unchanged(self):
        changes = snapshot_diff(self.frozen, tree_snapshot(self["root"]))
        if changes:
            self.freeze()   # report it once, not again in every later test sharing this hub
        assert not changes, "the read-only NAS tree was modified:\n" + "\n".join(changes[:20])

    def repo(self, repo_id=hubgen.MAIN_REPO):
        return self["repos"][repo_id]

    def repo_dir(self, repo_id=hubgen.MAIN_REPO):
        return os.path.join(self["hub"], self.repo(repo_id)["folder"])

    def snapshot_dir(self, repo_id=hubgen.MAIN_REPO):
        return os.path.join(self.repo_dir(repo_id), "snapshots", self.repo(repo_id)["commit"])


def build_nas(root, **kwargs):
    """A synthetic NAS hub built under root (hubgen.build_nas_hub's keyword arguments), frozen."""
    nas = NasHub(hubgen.build_nas_hub(str(root), **kwargs))
    nas["root"] = str(root)
    nas.freeze()
    return nas
