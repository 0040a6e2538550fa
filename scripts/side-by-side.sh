#!/usr/bin/env bash
# side-by-side.sh "BACKGROUND MAKE ARGS" FOREGROUND MAKE ARGS...: run two make targets at once (the machine's
# cores and the tests' waits overlap), the foreground one's output live, the background one's after it, and
# fail when either fails, saying which. Ctrl-C, a hang-up or a TERM to this script stops both, and all they started.
set -uo pipefail
make=${MAKE:-make}
background=$1
shift
log=$(mktemp)
pids=()
stop() {
    # Each target runs in its own process group (below): signal the groups, so their children stop too.
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    wait
    echo "---- make $background (stopped) ----"
    cat "$log"
    rm -f "$log"
    exit "$1"
}
trap 'stop 130' INT
trap 'stop 129' HUP
trap 'stop 143' TERM
trap 'rm -f "$log"' EXIT
# Each side leads a process group of its own (a background job ignores Ctrl-C; stop() signals the groups), and
# that leader gets a TERM when this script dies, of a KILL too (a cancelled CI job), and passes it to its whole
# group: make alone would leave the shell of its recipe's running line, and what that runs, behind.
side() {
    exec setsid setpriv --pdeathsig TERM bash -c 'trap "trap - TERM; kill -TERM 0" TERM; "$@" & wait $!' side "$@"
}
# Both in the background under `wait`, which a trapped signal interrupts at once (a foreground child would
# delay the trap until it ended).
side "$make" --no-print-directory $background > "$log" 2>&1 &
pids+=($!)
side "$make" --no-print-directory "$@" &
pids+=($!)
foreground_rc=0
wait "${pids[1]}" || foreground_rc=$?
background_rc=0
wait "${pids[0]}" || background_rc=$?
echo "---- make $background (ran beside make $*) ----"
cat "$log"
[[ $foreground_rc -eq 0 ]] || echo "make $*: failed (above)"
[[ $background_rc -eq 0 ]] || echo "make $background: failed (just above)"
exit $(( foreground_rc || background_rc ))
