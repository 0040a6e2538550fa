"""dgx_mountspec: can a path be bound into the engine container exactly as written?

Docker takes binds as API fields; Podman >= 4.1 reads `--mount` specs with Go's encoding/csv, so `:`, `,`, `"`,
`=` or a space is fine once CSV-quoted (engine_lane.py does that). Refused here, before a manifest names it:
invalid UTF-8 (Podman binds U+FFFD instead), any control character (encoding/csv turns CR LF into LF; the
others break line-based tools), a relative path or one not in normal form (both runtimes clean mount paths,
so the container would not show what the manifest says), and a path of PATH_MAX (4096) bytes or more.
Runs inside engine_manifest.
"""

import posixpath
import unicodedata

PATH_MAX = 4096

_CONTROL_NAMES = {
    0x00: "NUL", 0x09: "tab", 0x0A: "newline", 0x0B: "vertical tab", 0x0C: "form feed",
    0x0D: "carriage return", 0x1B: "escape", 0x7F: "DEL",
}


def mount_path_problem(path):
    """Why `path` cannot be a bind source or target exactly as written, or None: a sentence starting with the
    repr-quoted path, for the caller to prefix ("mount source %s")."""
    if not isinstance(path, str):
        return "%r is not a text path (%s)" % (path, type(path).__name__)
    if not path:
        return "'' is empty: a bind needs an absolute path"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ("%r is not valid UTF-8 (undecodable byte at character %d): Podman would replace it "
                "with U+FFFD and bind another path; rename the file" % (path, exc.start))
    code = next((ord(char) for char in path if ord(char) < 0x20 or ord(char) == 0x7F), None)
    if code is not None:
        name = _CONTROL_NAMES.get(code) or unicodedata.name(chr(code), "control character")
        if code == 0x0D:
            why = "Podman's --mount parser (Go encoding/csv) turns CR LF into LF and binds another path"
        else:
            why = "control characters are refused in bind paths (mount tables, logs and CSV mount specs rewrite them)"
        return "%r contains a %s (U+%04X): %s; rename the file" % (path, name, code, why)
    if not path.startswith("/"):
        return "%r is not absolute: a bind needs an absolute path" % path
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal != path:
        return ("%r is not in normal form (no '//', '.', '..' or trailing '/'; it would be %r): Docker and "
                "Podman clean bind paths, so the container would not show what the manifest says"
                % (path, normal))
    if len(encoded) >= PATH_MAX:
        return "%r is %d bytes long: a path must be shorter than PATH_MAX (%d bytes)" % (
            path[:64] + "...", len(encoded), PATH_MAX)
    return None
