#!/bin/sh
# Image build stage (Dockerfile, stage "build"), also run by test/deploy/dockerfile-steps.ts: installs the locked
# dependencies, compiles, and packs the package exactly as `npm pack` ships it. Run from the repository root.
#   scripts/docker/build.sh OUT_DIR   -> OUT_DIR/kvroute.tgz
set -eu
out="${1:?usage: scripts/docker/build.sh OUT_DIR}"
mkdir -p "$out"
# --ignore-scripts: this stage only compiles and packs, so no dependency's install script (zeromq, protobufjs, ...)
# needs to run here (the final stage's install runs them), and the project's own `prepare` build would only be
# undone by `npm pack`'s `prepack` (clean, then compile): one compile instead of two.
npm ci --no-audit --no-fund --prefer-offline --ignore-scripts
# prepack cleans dist/ and compiles it: the tarball holds what tsc made from these sources.
tarball="$(npm pack --silent --pack-destination "$out" | tail -n 1)"
mv "$out/$tarball" "$out/kvroute.tgz"
echo "packed $out/kvroute.tgz"
