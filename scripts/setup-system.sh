#!/usr/bin/env bash
# Install the Debian/Ubuntu packages the test suite needs: rsync, rootful Podman with runc,
# mmdebstrap for the base image, and python3-venv when ensurepip is missing. Idempotent: only
# missing packages are installed, and `apt-get update` runs only when something must be installed.
# Called by `make setup`.
set -euo pipefail

PACKAGES=(rsync podman crun fuse-overlayfs slirp4netns uidmap catatonit iptables runc mmdebstrap)

if ! command -v dpkg >/dev/null 2>&1; then
    echo "setup-system: dpkg not found; install these packages by hand: ${PACKAGES[*]}" >&2
    exit 0
fi

missing=()
# `python3 -m venv` needs ensurepip, which Debian/Ubuntu ship separately (python3-venv).
if ! "${PYTHON:-python3}" -c 'import ensurepip' >/dev/null 2>&1; then
    PACKAGES+=(python3-venv)
fi
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
    exit 0
fi

cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        echo "setup-system: installing ${missing[*]} (sudo)"
        sudo -n apt-get update -qq
        sudo -n env DEBIAN_FRONTEND=noninteractive "${cmd[@]}"
        exit 0
    fi
    echo "setup-system: missing system packages: ${missing[*]}" >&2
    echo "setup-system: run as root (or with sudo), then re-run make:" >&2
    echo "    sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive ${cmd[*]}" >&2
    exit 1
fi

echo "setup-system: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${cmd[@]}"
