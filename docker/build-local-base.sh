#!/usr/bin/env bash
# Build a base image for fedx's containers from Debian packages, for machines
# that reach no image registry (air-gapped sites, CI sandboxes) but do reach
# a Debian mirror and a Python package index.
#
#   sudo docker/build-local-base.sh                 # -> localhost/fedx-base:bookworm
#   FEDX_BASE_IMAGE=localhost/fedx-base:bookworm podman-compose build
#
# The image is Debian bookworm (python3 3.11, venv) made with debootstrap and
# imported with `podman import` (or `docker import`). It takes this machine's
# CA bundle, so pip inside the builds trusts what this machine trusts: a
# package index behind a TLS-inspecting proxy or an internal mirror works
# without mounting anything into the builds.
#
# Settings (environment): FEDX_BASE_IMAGE (name, default
# localhost/fedx-base:bookworm), CONTAINER_ENGINE (podman or docker; default:
# podman if installed), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt). Needs root
# (debootstrap) and the debootstrap package. Takes 1-4 minutes. An existing
# image of that name is kept (remove it to build a new one): every image built
# on it would be rebuilt otherwise.
set -euo pipefail

image="${FEDX_BASE_IMAGE:-localhost/fedx-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ca_bundle="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
engine="${CONTAINER_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"

fail() { echo "build-local-base.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "debootstrap needs root: run it with sudo"
command -v debootstrap >/dev/null || fail "debootstrap is not installed (apt-get install debootstrap)"
command -v "$engine" >/dev/null || fail "no container engine: install podman (or docker)"
if "$engine" image inspect "$image" >/dev/null 2>&1; then
    echo "$image exists; remove it ($engine rmi $image) to build it again"
    exit 0
fi
[ -r "$ca_bundle" ] || fail "no CA bundle at $ca_bundle (set CA_BUNDLE)"

root="$(mktemp -d /var/tmp/fedx-base.XXXXXX)"
trap 'rm -rf "$root"' EXIT

# minbase: essential packages only; python3-venv brings ensurepip's pip wheel.
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror" \
    > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; rm -f "$root.log"; fail "debootstrap failed"; }
rm -f "$root.log"
install -D -m 0644 "$ca_bundle" "$root/etc/ssl/certs/ca-certificates.crt"
# Package lists and caches are of no use in a base image.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*

tar -C "$root" -c . | "$engine" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    - "$image" >/dev/null 2>"$root.log" || { cat "$root.log" >&2; rm -f "$root.log"; fail "$engine import failed"; }
rm -f "$root.log"
echo "$image: $("$engine" run --rm "$image" python3 --version)"
