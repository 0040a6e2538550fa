#!/usr/bin/env bash
# A Docker engine for the tests, on machines without systemd. Starts dockerd only when `docker info`
# fails, remembers that it did (a pid file), and stops only the daemon it started.
#
#   scripts/docker-daemon.sh start          start dockerd unless one answers; wait until it does
#   scripts/docker-daemon.sh stop           stop the dockerd this script started (nothing else)
#   scripts/docker-daemon.sh status         say whether Docker answers, and who started it
#   scripts/docker-daemon.sh run -- CMD...  start if needed, run CMD, stop what was started; CMD's exit
#                                           code is kept, and the stop also runs on failure or Ctrl-C
#
# dockerd runs as root with `--iptables=false --bridge=none` (the tests use the host network only), its
# pid file and log under .cache/docker/ (DOCKER_DAEMON_DIR). Not root, or dockerd not installed: the
# script says so and exits 0 from start/run (tests that need Docker then skip, naming the reason).
# DOCKER_DAEMON_TIMEOUT: seconds to wait for a fresh daemon to answer (60).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DOCKER_DAEMON_DIR:-$REPO/.cache/docker}
PIDFILE=$DIR/dockerd.pid      # dockerd's own pid file
OURS=$DIR/started-here.pid    # written only when this script started the daemon
LOG=$DIR/dockerd.log
TIMEOUT=${DOCKER_DAEMON_TIMEOUT:-60}

say() { echo "docker-daemon: $*" >&2; }

answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

started_at() {
    # A process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid, it names one
    # process for good - a reused pid (a reboot, a copied .cache) is another process.
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }              # after the command name, which may hold spaces
    set -- $stat
    echo "${20}"                   # field 22 overall: 20th after pid and comm
}

our_pid() {
    # The pid this script started ("PID START" in $OURS), if that very process is still a dockerd.
    [[ -s "$OURS" ]] || return 1
    local pid start
    read -r pid start <"$OURS" || true
    [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == dockerd ]] || return 1
    [[ -n "$start" && "$(started_at "$pid")" == "$start" ]] || return 1
    echo "$pid"
}

start() {
    if answers; then
        if our_pid >/dev/null; then say "dockerd (pid $(our_pid)) started by this script answers"; else
            say "a Docker daemon answers already (not started here: left alone)"; fi
        return 0
    fi
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
        say "docker/dockerd not installed (make system-packages installs docker.io): not started"
        return 0
    fi
    if [[ $(id -u) -ne 0 ]]; then
        say "not root: cannot start dockerd (start it as root, or add this user to the docker group)"
        return 0
    fi
    mkdir -p "$DIR"
    if [[ -S /var/run/docker.sock ]] && ! answers && [[ -s "$PIDFILE" ]] \
            && [[ "$(cat "/proc/$(cat "$PIDFILE")/comm" 2>/dev/null)" == dockerd ]]; then
        say "a dockerd (pid $(cat "$PIDFILE")) runs but does not answer; see $LOG"
        return 1
    fi
    rm -f "$PIDFILE"
    # The log is appended to across starts: a failure quotes only this start's lines (from this offset).
    local from
    from=$(($(stat -c %s "$LOG" 2>/dev/null || echo 0) + 1))
    echo "=== docker-daemon.sh: start $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$LOG"
    # setsid: the daemon is not in the caller's process group, so a Ctrl-C reaches it only through stop().
    setsid dockerd --iptables=false --bridge=none --pidfile "$PIDFILE" >>"$LOG" 2>&1 </dev/null &
    local pid=$! waited=0
    echo "$pid $(started_at "$pid")" >"$OURS"
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$OURS"
            say "dockerd exited while starting; its log ($LOG) ends:"
            tail -c +"$from" "$LOG" | tail -n 20 >&2 || true
            return 1
        fi
        if ((waited >= TIMEOUT * 2)); then
            say "dockerd (pid $pid) did not answer within ${TIMEOUT}s; stopping it. Its log: $LOG"
            tail -c +"$from" "$LOG" | tail -n 20 >&2 || true
            stop
            return 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    say "started dockerd (pid $pid; log $LOG)"
}

stop() {
    local pid
    if ! pid=$(our_pid); then
        rm -f "$OURS"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= 60)); then
            say "dockerd (pid $pid) still runs after 30s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    rm -f "$OURS"
    say "stopped dockerd (pid $pid), which this script had started"
}

status() {
    if answers; then
        if our_pid >/dev/null; then echo "docker answers: dockerd pid $(our_pid), started by this script"
        else echo "docker answers: a daemon not started by this script"; fi
    else
        echo "docker does not answer"
        return 1
    fi
}

run() {
    [[ "${1:-}" == "--" ]] && shift
    (($# > 0)) || { say "run: no command given (usage: $0 run -- CMD...)"; return 2; }
    local started=0
    if ! our_pid >/dev/null && ! answers; then started=1; fi
    # Stop on every way out (exit, failure, Ctrl-C, TERM) - only the daemon started by this call.
    if ((started)); then
        trap 'stop' EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
    fi
    start || { say "run: no Docker daemon; running the command anyway (tests needing Docker skip)"; }
    local rc=0
    "$@" || rc=$?
    return "$rc"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 start|stop|status|run -- CMD..." >&2; exit 2 ;;
esac
