"""What no output may show (secret_values: engine_env's values, the engine command's secret flags') and hiding it
in any text, dict or list before it is cut or shown (redacted), on the nodes and in the role's filters.
"""
import json
import re
import shlex
from urllib.parse import quote, quote_plus, unquote

from ansible.module_utils.dgx_errors import StageError

# A name is secret when its last word (split on - _ . and spaces) is a credential word: HF_TOKEN, --api-key,
# AWS_SECRET_ACCESS_KEY, --apikey, --pw. A credential word elsewhere names a setting about credentials or tokens
# (--eos-token-id, --token-budget, num_key_value_heads, --api-key-file); a word that only ends like one is
# another word (--hotkey, --monkey, --oauth). A false match only hides a value, or refuses a short one.
SECRET_WORDS = frozenset((
    "token", "key", "secret", "password", "passwd", "passphrase", "pass", "pw", "pwd", "credential", "credentials",
    "auth", "authorization", "bearer", "apikey", "accesskey", "secretkey", "privatekey", "hftoken", "apitoken",
    "accesstoken", "authtoken"))
# A tokenizer's special tokens (pad_token: "<pad>") are vocabulary, not credentials.
VOCABULARY_TOKENS = frozenset(("pad", "eos", "bos", "unk", "sep", "cls", "mask"))
# Shorter values (a flag like 1, a device list like 0,1) are settings: hiding them would hide every such digit.
MIN_HIDDEN = 4
HIDDEN = "<hidden>"
# Flags whose value is name:password (curl -u admin:PASSWORD); a numeric part after the colon is a group id.
USER_FLAGS = ("-u", "--user", "-U", "--proxy-user")
# A credential inside a longer text runs to a space, quote, backslash or JSON/shell delimiter.
_CREDENTIAL = r"[^\s'\"\\,;()\[\]{}]+"
# A URL's password: scheme://user:PASSWORD@host.
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*:([^\s/@'\"]+)@")
# A header line (Authorization: Bearer X, X-Api-Key: X) and an authorization scheme's credential (Bearer X).
_HEADER = re.compile(r"\s*([A-Za-z][A-Za-z0-9_-]*)\s*:\s*(\S.*?)\s*")
_SCHEME = re.compile(r"(?:bearer|basic|token|digest)\s+(%s)" % _CREDENTIAL, re.IGNORECASE)
# A shell's operators (; && | >) are words of their own, never a flag's value.
_OPERATOR = re.compile(r"[;&|<>()]+")


def secret_name(name):
    """Whether a variable, flag, header or JSON key names a credential: its last word is a credential word."""
    words = [word for word in re.split(r"[-_.\s]+", str(name).lower()) if word]
    if not words or words[-1] not in SECRET_WORDS:
        return False
    return not (words[-1] == "token" and len(words) > 1 and words[-2] in VOCABULARY_TOKENS)


def _credential_of(value):
    """A secret value and, when it is an authorization (Bearer X, Basic X), its credential X on its own."""
    found = [value]
    scheme = _SCHEME.fullmatch(value.strip())
    if scheme:
        found.append(scheme.group(1))
    return found


def _embedded_secrets(text):
    """The secrets a text carries under any flag or key: a URL's password (raw and decoded), a secret header's
    value (Authorization: Bearer X gives X)."""
    found = []
    for password in _URL_PASSWORD.findall(text):
        found.extend(set((password, unquote(password))))
    header = _HEADER.fullmatch(text)
    if header and secret_name(header.group(1)):
        found.extend(_credential_of(header.group(2)))
    return found


def _json_secrets(text):
    """The values (list items too) of a JSON argument's secret-named keys (--config '{"api_key": …}') and what any
    of its strings carries (_embedded_secrets)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    found, todo = [], [(data, False)]
    while todo:
        item, secret = todo.pop()
        if isinstance(item, dict):
            todo.extend((value, secret_name(key)) for key, value in item.items())
        elif isinstance(item, list):
            todo.extend((value, secret) for value in item)
        elif isinstance(item, (str, int)) and not isinstance(item, bool):
            if secret:
                found.extend(_credential_of(str(item)))
            if isinstance(item, str):
                found.extend(_embedded_secrets(item))
    return found


def _shell_words(line):
    """A command line's words as a shell splits them, its operators (; && | > …) words of their own."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return line.split()


def _flag_value(flag, word):
    """The secret in word after flag: a secret flag's value (not a next flag or an operator: --disable-auth --tp 8),
    a user flag's password."""
    if not flag.startswith("-") or "=" in flag or word.startswith("-") or _OPERATOR.fullmatch(word):
        return []
    if flag in USER_FLAGS:
        return _user_password(word)
    return _credential_of(word) if secret_name(flag) else []


def _user_password(value):
    password = value.split(":", 1)[1] if ":" in value else ""
    return [password] if password and not password.isdigit() else []


def command_secrets(command):
    """The values of the command's secret flags (--api-key X, --api-key=X, HF_TOKEN=X) in its arguments, in any
    argument that is itself a command line (bash -c '…'), however nested, or a JSON object, and what any word
    carries (a URL's password, a secret header's credential, curl -u's password)."""
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
            name, _, value = word.partition("=")
            if value and not any(space in name for space in " \t\n"):
                if secret_name(name):
                    found.extend(_credential_of(value))
                elif name in USER_FLAGS:
                    found.extend(_user_password(value))
                found.extend(_json_secrets(value))
                found.extend(_embedded_secrets(value))
            found.extend(_flag_value(before, word))
            found.extend(_json_secrets(word))
            found.extend(_embedded_secrets(word))
    return found


def quoted_forms(value):
    """value as a message may quote it: itself, JSON- and repr-escaped, shell-quoted, URL-encoded (with or
    without / kept, + for a space, upper- or lower-case escapes)."""
    encoded = set((quote(value, safe=""), quote(value), quote_plus(value), quote_plus(value, safe="/")))
    lower = set(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), form) for form in encoded)
    return set((value, json.dumps(value)[1:-1], repr(value)[1:-1], shlex.quote(value))) | encoded | lower


def secret_values(env, command=None):
    """What no message may show, longest first, in every quoted form: each engine_env value of MIN_HIDDEN
    characters or more and the credential it carries, and the command's secret values (command_secrets); its
    other arguments (--tp 8) stay readable. A shorter secret cannot be hidden: StageError naming its source."""
    values = []
    for name, value in sorted((env or {}).items()):
        value = str(value)
        if len(value.strip()) < MIN_HIDDEN:
            if value.strip() and secret_name(name):
                raise StageError("engine_env %s: a credential of %d characters cannot be kept out of messages; "
                                 "set the real value" % (name, len(value.strip())))
            continue
        values.append(value)
        for embedded in _embedded_secrets(value):
            if len(embedded) < MIN_HIDDEN:
                raise StageError("engine_env %s: a password or credential of %d characters in its value cannot "
                                 "be kept out of messages; set the real value" % (name, len(embedded)))
            values.append(embedded)
    for value in command_secrets(command):
        if 0 < len(value.strip()) < MIN_HIDDEN:
            raise StageError("engine_command: a secret value of %d characters (a secret flag's, a header's or a "
                             "URL's password) cannot be kept out of messages; set the real value" % len(value.strip()))
        values.append(value)
    forms = set()
    for value in values:
        # A program may show a value stripped of the newline a YAML block or a file left on it.
        forms |= set(form for form in quoted_forms(value) | quoted_forms(value.strip()) if len(form) >= MIN_HIDDEN)
    return sorted(forms, key=lambda form: (-len(form), form))


def _hidden_text(text, secrets):
    """text with each stretch secrets cover, overlaps merged, replaced by one <hidden>: no piece of either of two
    overlapping secrets (abcdXYZ, XYZ123 in abcdXYZ123) is left."""
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
    """value (dicts, lists, strings) with secrets hidden in its strings; run on whole texts before any cut (a cut
    piece of a secret no longer matches)."""
    if isinstance(value, dict):
        return dict((key, redacted(item, secrets)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [redacted(item, secrets) for item in value]
    if isinstance(value, str):
        return _hidden_text(value, [secret for secret in secrets or [] if secret])
    return value
