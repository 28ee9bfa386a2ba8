# kvroute image: docker build -t kvroute:0.1.0 .
# Stage 1 compiles and packs the package (npm pack); stage 2 installs that tarball with production dependencies only
# and runs as the unprivileged "node" user (uid 1000). The same two scripts run in test/deploy/dockerfile-steps.ts, since no Docker
# daemon runs where the tests do.
FROM node:20-bookworm-slim AS build
WORKDIR /src
COPY . .
RUN sh scripts/docker/build.sh /out

FROM node:20-bookworm-slim
ENV NODE_ENV=production \
    KVROUTE_HOST=0.0.0.0
COPY --from=build /out/kvroute.tgz /tmp/kvroute.tgz
COPY scripts/docker/install.sh scripts/docker/healthcheck.mjs /opt/kvroute-image/
RUN sh /opt/kvroute-image/install.sh /tmp/kvroute.tgz /opt/kvroute \
    && rm /tmp/kvroute.tgz \
    && ln -s /opt/kvroute/node_modules/.bin/kvroute /usr/local/bin/kvroute
# The image's "node" user, by number: Kubernetes' runAsNonRoot can only verify a numeric user.
USER 1000:1000
WORKDIR /home/node
# 8080: `kvroute serve` (OpenAI API, /health, /metrics); 9002: `kvroute epp` (ext_proc gRPC); 9090: a separate metrics port.
EXPOSE 8080 9002 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["node", "/opt/kvroute-image/healthcheck.mjs"]
ENTRYPOINT ["kvroute"]
CMD ["serve"]
