#!/bin/sh
# Image runtime stage (Dockerfile, final stage), also run by test/deploy/dockerfile-steps.ts: installs the packed package
# with its production dependencies only (no TypeScript, no test tools) into PREFIX, whose node_modules/.bin/kvroute
# is the image's entrypoint.
#   scripts/docker/install.sh TARBALL PREFIX
set -eu
tarball="${1:?usage: scripts/docker/install.sh TARBALL PREFIX}"
prefix="${2:?usage: scripts/docker/install.sh TARBALL PREFIX}"
mkdir -p "$prefix"
cd "$prefix"
[ -f package.json ] || printf '{"name":"kvroute-image","private":true}\n' > package.json
npm install --omit=dev --no-audit --no-fund --no-save --prefer-offline "$tarball"
npm cache clean --force 2>/dev/null || true
"$prefix/node_modules/.bin/kvroute" --version
