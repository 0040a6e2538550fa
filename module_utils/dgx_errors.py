"""The one exception type the dgx-stage module_utils raise, and the commands their messages give as the fix."""


class StageError(Exception):
    """A staging step cannot proceed; the message names the file involved and the fix."""


def fix_command(subcommand, host=None, *extra_vars):
    """The `dgx-stage` command a message gives as the fix: subcommand, this host's --limit (when known), -e values."""
    words = ["dgx-stage", subcommand]
    if host:
        words += ["--limit", host]
    for value in extra_vars:
        words += ["-e", value]
    return "`%s`" % " ".join(words)
