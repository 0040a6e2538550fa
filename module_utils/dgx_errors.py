"""The one exception type the dgx-stage module_utils raise."""


class StageError(Exception):
    """A staging step cannot proceed; the message names the file involved and the fix."""
