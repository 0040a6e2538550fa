# -*- coding: utf-8 -*-
"""What no output may show, and hiding it: the values of engine_env and of the engine command's secret flags
(secret_values), removed from any text, dict or list before it is cut or shown (redacted).
Stdlib only (modules run on the nodes' system Python; the engine role's filters import it on the controller).
"""
from __future__ import absolute_import, division, print_function

import json
import re
import shlex
from urllib.parse import quote, quote_plus

from ansible.module_utils.dgx_errors import StageError

# A name one of whose words names a credential (HF_TOKEN, --api-key, AWS_SECRET_ACCESS_KEY) or ends with one
# (--apikey, --hftoken); not --max-total-tokens. A false match only hides a value.
SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "credential", "credentials", "auth")
# Shorter values (a flag like 1, a device list like 0,1) are settings: hiding them would hide every such digit.
MIN_HIDDEN = 4
HIDDEN = "<hidden>"


def secret_name(name):
    """Whether a variable, flag or JSON key names a credential."""
    return any(word.endswith(SECRET_WORDS) for word in re.split(r"[-_.\s]+", str(name).lower()) if word)


def _json_secrets(text):
    """The values of the secret-named keys of a JSON object given as an argument (--config '{"api_key": …}')."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    found, todo = [], [data]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if secret_name(key) and isinstance(value, (str, int)) and not isinstance(value, bool):
                    found.append(str(value))
                else:
                    todo.append(value)
        elif isinstance(item, list):
            todo.extend(item)
    return found


def _shell_words(line):
    """A command line's words as a shell splits them, its operators (; && | > …) words of their own."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return line.split()


def command_secrets(command):
    """The values of the command's secret flags (--api-key X, --api-key=X, HF_TOKEN=X), in the arguments, in the
    words of any argument that is itself a command line (bash -c '… --api-key X; …'), however nested, and in
    any argument that is a JSON object."""
    sequences = [[str(argument) for argument in command or []]]
    lines = list(sequences[0])
    while lines:
        line = lines.pop()
        words = _shell_words(line)
        if len(words) > 1:
            sequences.append(words)
            lines.extend(word for word in words if len(_shell_words(word)) > 1)
    found = []
    for words in sequences:
        for before, word in zip([""] + words, words):
            name = word.split("=", 1)[0]
            if "=" in word and not any(space in name for space in " \t\n") and secret_name(name):
                found.append(word.split("=", 1)[1])
            elif before.startswith("-") and "=" not in before and secret_name(before):
                found.append(word)
            found.extend(_json_secrets(word))
    return found


def quoted_forms(value):
    """value as a message may quote it: itself, JSON- and repr-escaped, shell-quoted, URL-encoded (with or
    without / kept, + for a space, upper- or lower-case escapes)."""
    encoded = set((quote(value, safe=""), quote(value), quote_plus(value), quote_plus(value, safe="/")))
    lower = set(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), form) for form in encoded)
    return set((value, json.dumps(value)[1:-1], repr(value)[1:-1], shlex.quote(value))) | encoded | lower


def secret_values(env, command=None):
    """What no message may show, longest first: every engine_env value of MIN_HIDDEN characters or more, and the
    value of every secret flag of the command (--api-key X), each in the forms a message quotes it in. The
    command's other arguments are settings (--tp 8) and stay readable. A secret-named variable or flag whose
    value is shorter than MIN_HIDDEN cannot be kept out of a message: StageError, naming it."""
    values = []
    for name, value in sorted((env or {}).items()):
        value = str(value)
        if len(value) < MIN_HIDDEN:
            if value and secret_name(name):
                raise StageError("engine_env %s: a credential of %d characters cannot be kept out of messages; "
                                 "set the real value" % (name, len(value)))
            continue
        values.append(value)
    for value in command_secrets(command):
        if 0 < len(value) < MIN_HIDDEN:
            raise StageError("engine_command: a secret flag's value of %d characters cannot be kept out of "
                             "messages; set the real value" % len(value))
        values.append(value)
    forms = set()
    for value in values:
        forms |= set(form for form in quoted_forms(value) if len(form) >= MIN_HIDDEN)
    return sorted(forms, key=lambda form: (-len(form), form))


def _hidden_text(text, secrets):
    """text with every stretch that any secret covers, overlapping ones merged, replaced by one <hidden>: two
    secrets that overlap (abcdXYZ and XYZ123 in abcdXYZ123) leave no piece of either."""
    spans = []
    for secret in secrets:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    if not spans:
        return text
    out, at = [], 0
    for start, end in sorted(spans):
        if start > at or not out:
            out.append(text[at:start])
            out.append(HIDDEN)
        at = max(at, end)
    return "".join(out) + text[at:]


def redacted(value, secrets):
    """value (dicts, lists, strings) with every one of secrets in its strings hidden. Callers run it on whole
    texts, before any cut: a piece of a secret cut at an edge no longer matches."""
    if isinstance(value, dict):
        return dict((key, redacted(item, secrets)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [redacted(item, secrets) for item in value]
    if isinstance(value, str):
        return _hidden_text(value, [secret for secret in secrets or [] if secret])
    return value
