#!/bin/sh
# Image build stage (Dockerfile, stage "build"), also run by test/deploy/dockerfile-steps.ts: installs the locked
# dependencies, compiles, and packs the package exactly as `npm pack` ships it. Run from the repository root.
#   scripts/docker/build.sh OUT_DIR   -> OUT_DIR/kvroute.tgz
set -eu
out="${1:?usage: scripts/docker/build.sh OUT_DIR}"
mkdir -p "$out"
npm ci --no-audit --no-fund --prefer-offline
# prepack cleans dist/ and compiles it again: the tarball holds what tsc made from these sources.
tarball="$(npm pack --silent --pack-destination "$out" | tail -n 1)"
mv "$out/$tarball" "$out/kvroute.tgz"
echo "packed $out/kvroute.tgz"
