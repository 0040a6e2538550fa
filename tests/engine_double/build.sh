#!/usr/bin/env bash
# Build the engine_double test image (a TEST DOUBLE of the inference engine) with Podman, from the
# local base image only (no registry). Cached: rebuilt only when engine_double.py or the
# Containerfile change (their hash is a label on the image).
#
# When a Docker daemon answers (scripts/docker-daemon.sh starts one for the tests), the image is also put
# into Docker (`podman save | docker load`) whenever Docker's image id differs from Podman's, under the
# same fully qualified local name: Docker must never try a registry for it.
#
# Usage: tests/engine_double/build.sh [--force]
# Environment: ENGINE_DOUBLE_IMAGE (localhost/dgx-stage-engine-double:test), BASE_IMAGE (dgx-stage-base:bookworm)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
IMAGE=${ENGINE_DOUBLE_IMAGE:-localhost/dgx-stage-engine-double:test}
BASE=${BASE_IMAGE:-dgx-stage-base:bookworm}
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

command -v podman >/dev/null 2>&1 || { echo "engine_double: podman not found (run: make system-packages)" >&2; exit 1; }

hash=$(cat "$HERE/Containerfile" "$HERE/engine_double.py" | sha256sum | cut -c1-16)
if ((FORCE == 0)) && podman image exists "$IMAGE"; then
    have=$(podman image inspect --format '{{ index .Labels "dgx-stage.engine-double.hash" }}' "$IMAGE" 2>/dev/null || true)
    if [[ "$have" == "$hash" ]]; then
        echo "engine_double: $IMAGE is up to date ($hash)"
        FORCE=-1
    fi
fi

# Docker gets Podman's image when it answers and holds another id (or none) under that name.
to_docker() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || {
        echo "engine_double: no Docker daemon answers; the image is in Podman only"
        return 0
    }
    local want have
    want=$(podman image inspect --format '{{.Id}}' "$IMAGE")
    have=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    if [[ "${have#sha256:}" == "${want#sha256:}" ]]; then
        echo "engine_double: $IMAGE is in Docker (${want:0:12})"
        return 0
    fi
    podman save "$IMAGE" | docker load >/dev/null
    have=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    [[ "${have#sha256:}" == "${want#sha256:}" ]] || {
        echo "engine_double: docker load of $IMAGE gave id '${have}', Podman has ${want}" >&2
        return 1
    }
    echo "engine_double: loaded $IMAGE into Docker (${want:0:12})"
}

if ((FORCE == -1)); then
    to_docker
    exit 0
fi

if ! podman image exists "$BASE"; then
    echo "engine_double: base image $BASE missing, building it"
    BASE_IMAGE=$BASE bash "$REPO/scripts/build-base-image.sh"
fi

podman build --pull=never --quiet \
    --build-arg "BASE_IMAGE=$BASE" --build-arg "DOUBLE_HASH=$hash" \
    --tag "$IMAGE" --file "$HERE/Containerfile" "$HERE" >/dev/null
echo "engine_double: built $IMAGE ($hash)"
to_docker
