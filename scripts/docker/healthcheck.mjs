// The image's HEALTHCHECK: GET /health of the router in this container (exit 0 on 200, 1 otherwise). The port is
// KVROUTE_PORT (the same variable `kvroute serve` reads), default 8080; KVROUTE_HEALTH_URL names another URL.
const port = process.env.KVROUTE_PORT || '8080';
const url = process.env.KVROUTE_HEALTH_URL || `http://127.0.0.1:${port}/health`;
try {
  const res = await fetch(url, { signal: AbortSignal.timeout(3000) });
  process.exit(res.status === 200 ? 0 : 1);
} catch {
  process.exit(1);
}
