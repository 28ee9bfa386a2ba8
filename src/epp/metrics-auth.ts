/**
 * Who may read the picker's /metrics, as the reference picker decides it with --metrics-endpoint-auth (on by default):
 * the caller's bearer token must be one the Kubernetes API authenticates (a TokenReview) and allows to `get` the
 * non-resource URL /metrics (a SubjectAccessReview), controller-runtime's authentication-and-authorization filter
 * (llm-d/llm-d-router cmd/epp/runner/runner.go @ebab6879, metricsserver FilterProvider). A Prometheus scraping with its
 * service account token (the chart's ServiceMonitor) passes; anything else gets 401 or 403. Verdicts are kept for a
 * short while so a scrape every few seconds costs the API server nothing much.
 *
 * `auto` is `kubernetes` when the picker discovers its pool from the Kubernetes API (it has credentials to ask with),
 * else `none`; /health stays open (probes carry no token).
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { EppConfig } from '../config/serve.ts';

export interface MetricsGuard {
  readonly mode: 'kubernetes' | 'none';
  /** null: may read; else the refusal. */
  check(req: IncomingMessage): Promise<{ status: number; message: string } | null>;
}

/** How long a token's verdict is kept. */
const VERDICT_TTL_MS = 10_000;

export function metricsAuthMode(config: Pick<EppConfig, 'metricsAuth' | 'k8sPool' | 'k8sSelector'>): 'kubernetes' | 'none' {
  if (config.metricsAuth !== 'auto') return config.metricsAuth;
  return config.k8sPool !== undefined || config.k8sSelector !== undefined ? 'kubernetes' : 'none';
}

export async function metricsGuard(
  config: Pick<EppConfig, 'metricsAuth' | 'k8sPool' | 'k8sSelector'>,
  options: { readonly kubeconfig?: string; readonly log: { warn(o: object, m: string): void } },
): Promise<MetricsGuard> {
  const mode = metricsAuthMode(config);
  if (mode === 'none') return { mode, check: async () => null };
  // The Kubernetes client (~800 files, ~0.7 s of CPU to load) only when the API server is asked: a picker without
  // metrics auth (or without Kubernetes) never loads it.
  const { AuthenticationV1Api, AuthorizationV1Api } = await import('@kubernetes/client-node');
  const { loadKubeConfig } = await import('../discovery/k8s/discovery.ts');
  const kc = loadKubeConfig(options.kubeconfig);
  const authn = kc.makeApiClient(AuthenticationV1Api);
  const authz = kc.makeApiClient(AuthorizationV1Api);
  const verdicts = new Map<string, { until: number; verdict: { status: number; message: string } | null }>();

  async function review(token: string): Promise<{ status: number; message: string } | null> {
    const tr = await authn.createTokenReview({ body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } } });
    const user = tr.status?.user;
    if (!tr.status?.authenticated || !user?.username) return { status: 401, message: 'the bearer token was not authenticated' };
    const sar = await authz.createSubjectAccessReview({
      body: {
        apiVersion: 'authorization.k8s.io/v1',
        kind: 'SubjectAccessReview',
        spec: {
          user: user.username,
          uid: user.uid,
          groups: user.groups,
          extra: user.extra,
          nonResourceAttributes: { path: '/metrics', verb: 'get' },
        },
      },
    });
    if (!sar.status?.allowed) return { status: 403, message: `${user.username} may not get /metrics` };
    return null;
  }

  return {
    mode,
    async check(req) {
      const header = req.headers.authorization ?? '';
      const m = /^Bearer\s+(\S+)$/i.exec(header);
      if (!m) return { status: 401, message: 'a bearer token is required (--metrics-auth kubernetes)' };
      const key = createHash('sha256').update(m[1]).digest('hex');
      const now = Date.now();
      const kept = verdicts.get(key);
      if (kept && kept.until > now) return kept.verdict;
      let verdict: { status: number; message: string } | null;
      try {
        verdict = await review(m[1]);
      } catch (err) {
        // The API server could not answer: refuse now, ask again next time (nothing is kept).
        options.log.warn({ error: (err as Error).message }, 'metrics token review failed');
        return { status: 503, message: 'the token review could not be done; try again' };
      }
      if (verdicts.size > 1000) verdicts.clear();
      verdicts.set(key, { until: now + VERDICT_TTL_MS, verdict });
      return verdict;
    },
  };
}
