#!/bin/sh
# Runs on a node (shared/prepare.yml, ansible.builtin.script): the /cache the night-shift log found.
#   stale-receipts.sh PARENT HUB_LOCAL_ROOT
# PARENT gets yesterday's receipt roots, root-owned with read-only files: two directories and one
# symlink root pointing at PARENT/keep/display-kv (a directory that is no receipt root and must
# survive the cleanup). HUB_LOCAL_ROOT is created empty (the node's local NVMe hub dir).
set -eu
parent=$1
hub=$2
yesterday=$(($(date +%s) - 86400))
mkdir -p "$hub" "$parent/keep/display-kv"
chmod 0755 "$hub" "$parent"
printf '{"keep": true}\n' > "$parent/keep/display-kv/worker.json"
for root in ds41-backend-attestation ds41-combined-ready; do
    mkdir -p "$parent/$root"
    printf '{"rank": 0, "run": "yesterday-bench"}\n' > "$parent/$root/worker.json"
    chown -R 0:0 "$parent/$root"
    chmod 0444 "$parent/$root/worker.json"
    touch -d "@$yesterday" "$parent/$root/worker.json" "$parent/$root"
done
ln -sfn "$parent/keep/display-kv" "$parent/ds41-display-kv"
touch -h -d "@$yesterday" "$parent/ds41-display-kv"
