#!/usr/bin/env bash
# Build the engine_double test image (a TEST DOUBLE of the inference engine) with Podman, from the
# local base image only (no registry). Cached: rebuilt only when engine_double.py or the
# Containerfile change (their hash is a label on the image).
#
# Usage: tests/engine_double/build.sh [--force]
# Environment: ENGINE_DOUBLE_IMAGE (dgx-stage-engine-double:test), BASE_IMAGE (dgx-stage-base:bookworm)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
IMAGE=${ENGINE_DOUBLE_IMAGE:-dgx-stage-engine-double:test}
BASE=${BASE_IMAGE:-dgx-stage-base:bookworm}
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

command -v podman >/dev/null 2>&1 || { echo "engine_double: podman not found (run: make system-packages)" >&2; exit 1; }

hash=$(cat "$HERE/Containerfile" "$HERE/engine_double.py" | sha256sum | cut -c1-16)
if ((FORCE == 0)) && podman image exists "$IMAGE"; then
    have=$(podman image inspect --format '{{ index .Labels "dgx-stage.engine-double.hash" }}' "$IMAGE" 2>/dev/null || true)
    if [[ "$have" == "$hash" ]]; then
        echo "engine_double: $IMAGE is up to date ($hash)"
        exit 0
    fi
fi

if ! podman image exists "$BASE"; then
    echo "engine_double: base image $BASE missing, building it"
    BASE_IMAGE=$BASE bash "$REPO/scripts/build-base-image.sh"
fi

podman build --pull=never --quiet \
    --build-arg "BASE_IMAGE=$BASE" --build-arg "DOUBLE_HASH=$hash" \
    --tag "$IMAGE" --file "$HERE/Containerfile" "$HERE" >/dev/null
echo "engine_double: built $IMAGE ($hash)"
