#!/usr/bin/env bash
# Build the Podman base image for the Molecule scenarios (no image registry on the test machines):
# a minimal Debian root filesystem made by mmdebstrap from this machine's own apt sources,
# piped into `podman import`. The apt sources are read at run time and stripped from the image
# again, so no mirror host is ever written to the repo or baked into the image.
#
# Usage: scripts/build-base-image.sh [--force]
# Environment:
#   BASE_IMAGE         image name           (default dgx-stage-base:bookworm)
#   BASE_IMAGE_SUITE   Debian suite         (default: the image tag, bookworm)
#   BASE_IMAGE_SOURCES apt sources file(s), deb822 or one-line, space-separated
#                      (default: /etc/apt/sources.list and /etc/apt/sources.list.d/*.{list,sources})
set -euo pipefail

IMAGE=${BASE_IMAGE:-dgx-stage-base:bookworm}
SUITE=${BASE_IMAGE_SUITE:-${IMAGE##*:}}
INCLUDE=python3,procps
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

if ((FORCE == 0)) && podman image exists "$IMAGE"; then
    echo "build-base-image: $IMAGE exists, skipping (use --force to rebuild)"
    exit 0
fi
for tool in podman mmdebstrap python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "build-base-image: $tool not found (run: make system-packages)" >&2; exit 1; }
done

if [[ -n "${BASE_IMAGE_SOURCES:-}" ]]; then
    read -r -a source_files <<<"$BASE_IMAGE_SOURCES"
else
    shopt -s nullglob
    source_files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    shopt -u nullglob
fi

# Keep only binary ("deb") entries for SUITE and its -updates/-security siblings; third-party
# repositories on the host (other suites) are dropped. Both apt formats are understood.
sources=$(python3 - "$SUITE" "${source_files[@]}" <<'PY'
import os
import re
import sys

suite, files = sys.argv[1], sys.argv[2:]
want = re.compile(r"^%s(-[a-z]+)?/?$" % re.escape(suite))
out = []
for path in files:
    if not os.path.isfile(path):
        continue
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if path.endswith(".sources"):
        for para in re.split(r"\n\s*\n", text):
            fields, key = {}, None
            for line in para.splitlines():
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                if line[0] in " \t" and key:
                    fields[key] += " " + line.strip()
                elif ":" in line:
                    key, _, value = line.partition(":")
                    key = key.strip().lower()
                    fields[key] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in fields.get("types", "").split():
                continue
            suites = [s for s in fields.get("suites", "").split() if want.match(s)]
            if not suites or not fields.get("uris"):
                continue
            stanza = ["Types: deb", "URIs: " + fields["uris"], "Suites: " + " ".join(suites),
                      "Components: " + fields.get("components", "main")]
            if fields.get("signed-by"):
                stanza.append("Signed-By: " + fields["signed-by"])
            out.append("\n".join(stanza) + "\n")
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            options = " ".join(re.findall(r"\[([^]]*)\]", line)).split()
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 3 and words[0] == "deb" and want.match(words[2]):
                stanza = "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n" % (
                    words[1], words[2], " ".join(words[3:]) or "main")
                for opt in options:
                    if opt.startswith("signed-by="):
                        stanza += "Signed-By: %s\n" % opt.split("=", 1)[1]
                out.append(stanza)
if not out:
    sys.exit("build-base-image: no '%s' apt source in %s; set BASE_IMAGE_SOURCES to a file "
             "with a %s entry" % (suite, " ".join(files) or "(no files)", suite))
sys.stdout.write("\n".join(out))
PY
)

old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
echo "build-base-image: building $IMAGE (mmdebstrap $SUITE, minbase + $INCLUDE)"
start=$SECONDS
# stdin carries the sources (MIRROR "-"), stdout the tarball (TARGET "-"). If mmdebstrap fails
# part-way, podman may still have imported a truncated tarball: remove it so no broken image is
# cached. The hooks' "$1" is the chroot, expanded by mmdebstrap, not here.
# shellcheck disable=SC2016
if ! printf '%s\n' "$sources" |
    mmdebstrap --quiet --variant=minbase --include="$INCLUDE" --format=tar \
        --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/*' \
        "$SUITE" - - |
    podman import --quiet \
        --change 'CMD ["/bin/sleep", "infinity"]' \
        --change 'LABEL org.opencontainers.image.title=dgx-stage-base' \
        --message "mmdebstrap --variant=minbase --include=$INCLUDE $SUITE" \
        - "$IMAGE" >/dev/null; then
    podman image rm --force "$IMAGE" >/dev/null 2>&1 || true
    echo "build-base-image: failed to build $IMAGE" >&2
    exit 1
fi
# A rebuild (--force) leaves the previous image untagged: drop it.
if [[ -n "$old_id" && "$old_id" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]]; then
    podman image rm "$old_id" >/dev/null 2>&1 || true
fi
echo "build-base-image: $IMAGE built in $((SECONDS - start)) s"
