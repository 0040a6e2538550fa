#!/usr/bin/env bash
# side-by-side.sh "BACKGROUND MAKE ARGS" FOREGROUND MAKE ARGS...: run two make targets at once (the machine's
# cores and the tests' waits overlap), the foreground one's output live, the background one's after it, and
# fail when either fails, saying which. Stopping this script stops both.
set -uo pipefail
background=$1
shift
log=$(mktemp)
# Its own process group, so that a stop reaches all it started (a background job ignores Ctrl-C).
setsid make --no-print-directory $background > "$log" 2>&1 &
pid=$!
trap 'kill -TERM -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"; exit 130' INT TERM
trap 'rm -f "$log"' EXIT
foreground_rc=0
make --no-print-directory "$@" || foreground_rc=$?
background_rc=0
wait "$pid" || background_rc=$?
echo "---- make $background (ran beside make $*) ----"
cat "$log"
[[ $foreground_rc -eq 0 ]] || echo "make $*: failed (above)"
[[ $background_rc -eq 0 ]] || echo "make $background: failed (just above)"
exit $(( foreground_rc || background_rc ))
