"""A role's filter plugin loaded from its file, as Ansible loads it (the roles are no Python packages)."""
import importlib.util
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_filter(role, name):
    """roles/<role>/filter_plugins/<name>.py as a module of its own."""
    path = os.path.join(REPO_ROOT, "roles", role, "filter_plugins", name + ".py")
    spec = importlib.util.spec_from_file_location("%s_filter_under_test" % name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
