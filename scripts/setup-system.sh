#!/usr/bin/env bash
# Debian/Ubuntu packages, by what needs them (only missing ones are installed; `apt-get update` runs
# only when something must be installed; installing needs root, or sudo without a password):
#   setup-system.sh venv    python3-venv, only when `$PYTHON -m venv` lacks ensurepip (make setup, once)
#   setup-system.sh test    what only the tests need: rsync, rootful Podman with runc, mmdebstrap for the
#                           base image, a Docker engine (docker.io; scripts/docker-daemon.sh starts it) and
#                           python3-requests (community.docker's need on a node's system Python)
#                           (make test / integration / molecule / image / system-packages)
#   setup-system.sh bench   rsync, the bench's baseline; never fatal (make bench)
# `make setup` and `make demo` need none of the test packages: an ordinary user runs them without root.
set -euo pipefail

mode=${1:-test}
case "$mode" in
    venv)
        if "${PYTHON:-python3}" -c 'import ensurepip' >/dev/null 2>&1; then exit 0; fi
        PACKAGES=(python3-venv) ;;
    test)
        PACKAGES=(rsync podman crun fuse-overlayfs slirp4netns uidmap catatonit iptables runc mmdebstrap
                  docker.io python3-requests) ;;
    bench)
        PACKAGES=(rsync) ;;
    *)
        echo "usage: $0 [venv|test|bench]" >&2
        exit 2 ;;
esac

if ! command -v dpkg >/dev/null 2>&1; then
    echo "setup-system: dpkg not found; install these packages by hand: ${PACKAGES[*]}" >&2
    [[ "$mode" == venv ]] && exit 1
    exit 0
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
((${#missing[@]} == 0)) && exit 0

cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
if [[ $(id -u) -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "setup-system ($mode): missing system packages: ${missing[*]}" >&2
    echo "setup-system: install them as root (or with sudo), then re-run make:" >&2
    echo "    sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive ${cmd[*]}" >&2
    [[ "$mode" == bench ]] && exit 0
    exit 1
fi

echo "setup-system ($mode): installing ${missing[*]}"
if ! { "${sudo[@]}" apt-get update -qq &&
       "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive "${cmd[@]}"; }; then
    [[ "$mode" == bench ]] && { echo "setup-system: could not install ${missing[*]}" >&2; exit 0; }
    exit 1
fi
