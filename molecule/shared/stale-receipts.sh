#!/bin/sh
# Runs on a node (shared/prepare.yml, ansible.builtin.script): the /cache the night-shift log found.
#   stale-receipts.sh PARENT HUB_LOCAL_ROOT ROOT...
# PARENT gets yesterday's receipt roots ROOT... (the engine's names, from dgx_receipts.RECEIPT_ROOTS),
# root-owned with read-only files: a directory each but the last, which is a symlink root pointing at
# PARENT/keep/display-kv (a directory that is no receipt root and must survive the cleanup).
# HUB_LOCAL_ROOT is created empty (the node's local NVMe hub dir).
set -eu
if [ $# -lt 3 ]; then
    echo "usage: stale-receipts.sh PARENT HUB_LOCAL_ROOT ROOT..." >&2
    exit 2
fi
parent=$1
hub=$2
shift 2
yesterday=$(($(date +%s) - 86400))
mkdir -p "$hub" "$parent/keep/display-kv"
chmod 0755 "$hub" "$parent"
printf '{"keep": true}\n' > "$parent/keep/display-kv/worker.json"
while [ $# -gt 1 ]; do
    root=$1
    shift
    mkdir -p "$parent/$root"
    printf '{"rank": 0, "run": "yesterday-bench"}\n' > "$parent/$root/worker.json"
    chown -R 0:0 "$parent/$root"
    chmod 0444 "$parent/$root/worker.json"
    touch -d "@$yesterday" "$parent/$root/worker.json" "$parent/$root"
done
ln -sfn "$parent/keep/display-kv" "$parent/$1"
touch -h -d "@$yesterday" "$parent/$1"
