#!/usr/bin/env bash
# Local STAND-INS for the Dockerfile's two base images, for machines that cannot pull them
# (the test machines reach Debian's and crates.io's mirrors but no container registry).
#
#   rust:1.95-slim-bookworm                 Debian bookworm (debootstrap minbase, plus gcc,
#                                           libc6-dev and ca-certificates, as the real image
#                                           has) with THIS machine's Rust toolchain copied in
#   gcr.io/distroless/cc-debian12:nonroot   the same Debian's libc, libgcc, libstdc++, libssl,
#                                           CA certificates and time zones, users root,
#                                           nobody and nonroot (65532), and nothing else: no
#                                           shell, no package manager, as in distroless
#
# They carry the real names only so that the Dockerfile builds unchanged (`podman build
# --pull=never`); they are NOT the published images, live only in this machine's podman
# store, carry the label cellrate.stand-in=true (so does every image built on them), and
# must never be pushed. Where the real images are present (pulled), they are used instead.
#
# Made once per machine: `podman image exists` says whether each is there. The debootstrap
# root is cached as a tarball under ~/.cache/cellrate/ (keyed by the package list), so
# re-making the images after `podman system reset` takes about a minute instead of four.
# Usage: scripts/stand-in-images.sh [--force]   (--force re-makes both images)
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/scripts/podman-containers.conf"
[ "$(id -u)" = 0 ] || { echo "stand-in-images: needs root (rootful podman, debootstrap)" >&2; exit 1; }

builder=docker.io/library/rust:1.95-slim-bookworm
runtime=gcr.io/distroless/cc-debian12:nonroot
# The Dockerfile must name exactly these (a renamed base image would be pulled, and fail).
for name in rust:1.95-slim-bookworm "$runtime"; do
  grep -q "^FROM $name\b" Dockerfile || { echo "the Dockerfile no longer names FROM $name" >&2; exit 1; }
done

# podman (with runc: see scripts/podman-containers.conf), debootstrap, and uidmap (for the
# user namespaces podman sets up), from Debian's packages, when missing.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 \
  || ! command -v debootstrap >/dev/null 2>&1 || ! command -v newuidmap >/dev/null 2>&1; then
  echo "installing podman, runc, debootstrap and uidmap from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap uidmap \
    >/dev/null
fi
force=0
[ "${1:-}" = --force ] && force=1
if [ "$force" = 0 ] && podman image exists "$builder" && podman image exists "$runtime"; then
  echo "stand-in base images present (podman image exists): $builder, $runtime"
  exit 0
fi

# The host's toolchain must be the version the builder's name promises.
rustc_version=$(rustc --version | awk '{print $2}')
case "$rustc_version" in
  1.95.*) ;;
  *) echo "this machine's rustc is $rustc_version; the stand-in for $builder needs 1.95" >&2; exit 1 ;;
esac
sysroot=$(rustc --print sysroot)
[ -x "$sysroot/bin/cargo" ] || { echo "no cargo in the toolchain at $sysroot" >&2; exit 1; }

started=$(date +%s)
# With --force, the images these replace are removed afterwards (unless images built on
# them still use them).
old_images=$(podman image inspect -f '{{.Id}}' "$builder" "$runtime" 2>/dev/null || true)
work=$(mktemp -d /var/tmp/cellrate-stand-in.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The Debian root, from the cache or from debootstrap.
packages=gcc,libc6-dev,ca-certificates,tzdata,netbase,libssl3,libstdc++6
cache="${XDG_CACHE_HOME:-$HOME/.cache}/cellrate"
tarball="$cache/bookworm-minbase-$(echo "$packages" | sha256sum | cut -c1-12).tar.gz"
root="$work/debian"
mkdir -p "$root" "$cache"
if [ -s "$tarball" ]; then
  echo "Debian bookworm root from the cache: $tarball"
  tar -C "$root" -xzf "$tarball"
else
  echo "debootstrap of Debian bookworm (minbase, plus $packages) into $root"
  debootstrap --variant=minbase --include="$packages" bookworm "$root" \
    http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -czf "$tarball.part" . && mv "$tarball.part" "$tarball"
fi
echo "Debian root ready after $(($(date +%s) - started)) s"

# The builder: the Debian root and the toolchain (without its documentation) at
# /usr/local/rust; the cargo home /usr/local/cargo is empty, as in the real image.
mkdir -p "$root/usr/local/rust" "$root/usr/local/cargo"
tar -C "$sysroot" --exclude=./share/doc -c . | tar -C "$root/usr/local/rust" -x
tar -C "$root" -c . | podman import --quiet \
  --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV CARGO_HOME=/usr/local/cargo' \
  --change "ENV RUST_VERSION=$rustc_version" \
  --change 'LABEL cellrate.stand-in=true' \
  --change 'LABEL cellrate.stand-in.for=rust:1.95-slim-bookworm' \
  --change 'CMD ["bash"]' \
  - "$builder" >/dev/null
echo "made the stand-in $builder after $(($(date +%s) - started)) s"

# The runtime: only the files of the packages distroless/cc ships, copied out of the
# Debian root (real directories: distroless does not merge /lib into /usr/lib).
run="$work/distroless"
mkdir -p "$run"
for pkg in base-files netbase tzdata libc6 libgcc-s1 libstdc++6 libssl3 ca-certificates; do
  dpkg --admindir="$root/var/lib/dpkg" -L "$pkg"
done | sort -u | while read -r path; do
  # Bookworm's merged /usr makes these links in the Debian root; here they are directories.
  case "$path" in /bin | /sbin | /lib | /lib32 | /lib64 | /libx32) continue ;; esac
  if [ -f "$root$path" ] || [ -L "$root$path" ]; then
    mkdir -p "$run$(dirname "$path")"
    cp -a "$root$path" "$run$path"
  fi
done
# The certificate bundle update-ca-certificates wrote, and the users distroless defines.
mkdir -p "$run/etc/ssl" "$run/tmp" "$run/home/nonroot" "$run/root"
cp -a "$root/etc/ssl/certs" "$run/etc/ssl/"
chmod 1777 "$run/tmp"
chown 65532:65532 "$run/home/nonroot"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
  'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$run/etc/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' \
  >"$run/etc/group"
if [ -e "$run/bin/sh" ] || [ -e "$run/usr/bin/sh" ] || [ -e "$run/bin/bash" ]; then
  echo "the distroless stand-in has a shell; distroless has none" >&2
  exit 1
fi
tar -C "$run" -c . | podman import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'USER 65532' \
  --change 'WORKDIR /home/nonroot' \
  --change 'LABEL cellrate.stand-in=true' \
  --change 'LABEL cellrate.stand-in.for=gcr.io/distroless/cc-debian12:nonroot' \
  - "$runtime" >/dev/null
echo "made the stand-in $runtime; stand-ins ready in $(($(date +%s) - started)) s"
for id in $old_images; do podman rmi "$id" >/dev/null 2>&1 || true; done
