#!/usr/bin/env bash
# Make a Python 3.11 base image without a container registry: debootstrap a minimal
# Debian bookworm, give it a virtual environment on PATH (as python:3.11-slim has
# python and pip on PATH) and Python's headers (vLLM's CPU engine compiles against
# them, as in the official image), and `podman import` it. Does nothing if the tag exists.
#   deploy/podman/base-image.sh [TAG]        (default localhost/triad-base:bookworm; root)
# Then: podman build --build-arg BASE=TAG ...   (see deploy/README.md)
set -euo pipefail
tag="${1:-localhost/triad-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if podman image exists "$tag"; then
  exit 0
fi
for tool in debootstrap podman; do
  command -v "$tool" >/dev/null || { echo "base-image: $tool is not installed (apt-get install $tool)" >&2; exit 2; }
done
root="$(mktemp -d /var/tmp/triad-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
  bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; echo "base-image: debootstrap from $mirror failed (log above)" >&2; exit 2; }
rm -f "$root.log"
chroot "$root" /usr/bin/python3 -m venv /opt/python
chroot "$root" /usr/bin/apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
tar -C "$root" -c . | podman import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "base-image: made $tag" >&2
