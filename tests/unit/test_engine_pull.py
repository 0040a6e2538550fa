"""engine_pull through dgx_runtime.pull_image: never pulls nothing, missing pulls only an absent image, always
pulls every run; only a new image id counts as a change, so an unchanged lane re-run is changed=0."""
import pytest

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_runtime import pull_image


class Runtime(object):
    """A runtime CLI whose image has id `before` until a pull gives it `after`."""

    def __init__(self, before, after, pull_rc=0):
        self.image, self.after, self.pull_rc, self.pulls = before, after, pull_rc, 0

    def get_bin_path(self, name):
        return "/usr/bin/" + name

    def run_command(self, argv):
        if argv[1:3] == ["image", "inspect"]:
            return (0, self.image + "\n", "") if self.image else (1, "", "no such image")
        assert argv[1] == "pull"
        self.pulls += 1
        if self.pull_rc:
            return self.pull_rc, "", "denied: token hf_secret"
        self.image = self.after
        return 0, "", ""


@pytest.mark.parametrize("pull, before, after, pulls, changed", [
    ("never", None, "sha-b", 0, False),
    ("missing", "sha-a", "sha-b", 0, False),
    ("missing", None, "sha-b", 1, True),
    ("always", "sha-a", "sha-a", 1, False),
    ("always", "sha-a", "sha-b", 1, True),
    ("always", None, "sha-b", 1, True),
])
def test_a_pull_is_a_change_only_when_the_image_id_changes(pull, before, after, pulls, changed):
    runtime = Runtime(before, after)
    pulled, image_id = pull_image(runtime, "podman", "localhost/engine:1", pull)
    assert (runtime.pulls, pulled) == (pulls, changed)
    assert image_id == (after if pulls else before or "")


def test_a_failed_pull_says_why_without_the_secrets():
    with pytest.raises(StageError) as raised:
        pull_image(Runtime(None, "x", pull_rc=1), "docker", "engine:1", "missing", secrets=["hf_secret"])
    assert "docker pull engine:1: denied" in str(raised.value) and "hf_secret" not in str(raised.value)
