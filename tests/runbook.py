"""Reading and running the ```console blocks of docs/runbooks/*.md: shared by the runbook parser's unit tests
and tests/integration/test_runbooks.py, which runs every runbook against a staged demo.

A `$ ` line is a command (a trailing `# exits N` gives its expected exit status, else 0); the lines under it
are excerpts of its output: a line matches when its words appear in order on one line of the real output,
`...` standing for anything (paths, rates), and a run id or timestamp for any other."""
import os
import re
import shlex
import subprocess

CONSOLE_BLOCK = re.compile(r"^```console[ \t]*\n(.*?)^```", re.M | re.S)
EXPECTED_EXIT = re.compile(r"#\s*exits\s+(\d+)\s*$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# A lane run id (20261201T101711Z-addc), a front-end run ident (20261201T101710Z-verify-8aa6), a timestamp.
VOLATILE = re.compile(r"(\d{8}T\d{6}Z-(?:[a-z-]+-)?[0-9a-f]{4}|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def _word_pattern(word):
    return "".join(VOLATILE.pattern if i % 2 else re.escape(part)
                   for i, part in enumerate(VOLATILE.split(word)))


def excerpt_pattern(line):
    """An output line of a runbook as a regex: its words in order, any spacing, `...` for anything, and
    any run id or timestamp where the excerpt shows one (they change with every run)."""
    pieces = [r"\s+".join(_word_pattern(word) for word in piece.split()) for piece in line.split("...")]
    return re.compile(".*?".join(pieces))


def runbook_steps(text):
    """[{command, rc, expect: [output lines]}] of every ```console block, in order."""
    steps = []
    for block in CONSOLE_BLOCK.findall(text):
        for line in block.splitlines():
            if line.startswith("$ "):
                command = line[2:].strip()
                found = EXPECTED_EXIT.search(command)
                steps.append({"command": command, "rc": int(found.group(1)) if found else 0, "expect": []})
            elif line.strip() and line.strip() != "...":
                assert steps, "output before the first command of a console block: %r" % line
                steps[-1]["expect"].append(line.strip())
    return steps


def run_steps(work, steps, out_dir, env, timeout):
    """Run the commands in one bash session at `work` (an `export` carries over), each one's output and exit
    status in files under out_dir; returns [(output, rc, seconds)]."""
    os.makedirs(out_dir)
    script = ["cd %s || exit 90" % shlex.quote(work)]
    for i, step in enumerate(steps):
        out = shlex.quote(os.path.join(out_dir, "%d" % i))
        # The newline before } keeps a trailing `# exits N` comment from hiding the brace.
        script.append('s=$(date +%%s.%%N); { %s\n} >%s.out 2>&1 </dev/null; echo "$? $s $(date +%%s.%%N)" >%s.rc'
                      % (step["command"], out, out))
    subprocess.run(["bash", "-c", "\n".join(script)], env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    results = []
    for i in range(len(steps)):
        path = os.path.join(out_dir, "%d" % i)
        with open(path + ".out", "rb") as handle:
            output = ANSI.sub("", handle.read().decode("utf-8", "replace"))
        with open(path + ".rc") as handle:
            rc, start, end = handle.read().split()
        results.append((output, int(rc), float(end) - float(start)))
    return results
