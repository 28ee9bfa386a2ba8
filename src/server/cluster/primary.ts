/**
 * `kvroute serve --processes N`, the primary's side: it runs the whole router (src/server/app.ts) on an internal
 * loopback port, forks N HTTP shells (node:cluster) that share the public port, and answers their IPC: each submission
 * goes to the one Lifecycle/Dispatcher, in the order received, so decisions are the ones a single process makes for the
 * same sequence. A shell that dies is replaced; the requests it had in flight are finished as cancelled (once: what it
 * wrote before dying and arrives after its exit is ignored), so the dispatcher's active load does not keep them. A stop
 * drains every started shell and kills one not started yet (it holds nothing). The request metrics each shell records
 * stay in its own registry: the primary asks for them at scrape time and /metrics (forwarded by a shell to the primary)
 * shows their sum with its own registry; what a shell reported before it died is kept (a counter never goes back).
 */
import cluster, { type Worker as ClusterWorker } from 'node:cluster';
import { fileURLToPath } from 'node:url';
import { AggregatorRegistry, Counter } from 'prom-client';
import type { Logger } from 'pino';
import type { ServeConfig } from '../../config/serve.ts';
import type { RunningServer } from '../app.ts';
import { recentDecisionOf } from '../inference.ts';
import type { RouteDecision } from '../../core/types.ts';
import { sumCaches, type TokenizerCacheGauges } from '../../metrics/memory.ts';
import type { MetricJson } from '../../metrics/registry.ts';
import { addTotals, type RequestTotalsJson } from '../../metrics/requests.ts';
import type { ShellMetricsSnapshot } from '../../metrics/shell-metrics.ts';
import { ClientCancel } from '../../runtime/cancel.ts';
import type { NextStep } from '../../runtime/lifecycle.ts';
import {
  isShellMessage,
  shellMessageProblem,
  Outbox,
  type PrimaryMessage,
  type ShellMessage,
  type ShellWorkerInfo,
  type WireDecision,
} from './protocol.ts';

/**
 * The decision as it crosses to a shell: without its hashes and every candidate's scores (the shell reads neither; a
 * typed array also takes node's slower host-object path in the channel's serializer). The shell puts empty ones back.
 */
function wireDecision(d: RouteDecision): WireDecision {
  const { seqHashes: _h, candidates: _c, ...rest } = d;
  return rest;
}

function wireStep(step: NextStep): NextStep {
  if (step.kind !== 'dispatch') return step;
  const prefill = step.prefill ? { ...step.prefill, decision: wireDecision(step.prefill.decision) } : undefined;
  return { ...step, decision: wireDecision(step.decision), ...(prefill ? { prefill } : {}) } as unknown as NextStep;
}

export interface RunningCluster {
  /** The public URL the shells listen on. */
  readonly url: string;
  /** Pids of the shells now running. */
  shellPids(): number[];
  /** Shells started to replace ones that died. */
  readonly replaced: () => number;
  /**
   * Tells every started shell to stop accepting and finish within the grace period (killed 5 s after it), kills any not
   * started yet; resolves when all have exited.
   */
  close(graceMs: number): Promise<void>;
}

interface ShellState {
  readonly worker: ClusterWorker;
  /** Submissions (or retries) waiting for the dispatcher's next step: aborted when the shell cancels or dies. */
  readonly waiting: Map<string, ClientCancel>;
  /** Workers whose connection details this shell has been sent (each is sent once, with the first step to it). */
  readonly told: WeakSet<object>;
  /**
   * Requests submitted and not yet finished, with the API each came in on (what /debug/state's recent decisions show of
   * the attempts the primary dispatches).
   */
  readonly active: Map<string, string>;
  readonly outbox: Outbox<PrimaryMessage>;
  /** kvr.start has been sent: until then the shell runs nothing of its own (a replacement still booting). */
  started: boolean;
  listening: boolean;
  /** The shell's request metrics as it last reported them (asked at scrape time, or sent after a change). */
  metrics: ShellMetricsSnapshot | null;
}

/** The registry JSON of a snapshot; null if it does not read as one (left out of the sum). */
function parseSnapshot(m: ShellMetricsSnapshot): MetricJson[] | null {
  try {
    const json = JSON.parse(m.json) as unknown;
    return Array.isArray(json) && json.every((x) => typeof x?.name === 'string' && Array.isArray(x.values)) ? (json as MetricJson[]) : null;
  } catch {
    return null;
  }
}

function emptyTotals(): RequestTotalsJson {
  return { overhead: {}, outcomes: {}, refusals: {}, ttft: { sum: 0, count: 0 }, itl: { sum: 0, count: 0 } };
}

function shellEntry(): { exec: string; execArgv: string[] } {
  // Built: dist/server/cluster/shell-main.js. From source (tests under tsx): the .ts file, through tsx.
  const self = fileURLToPath(import.meta.url);
  const ts = self.endsWith('.ts');
  return {
    exec: self.replace(/primary\.(ts|js)$/, `shell-main.${ts ? 'ts' : 'js'}`),
    // The primary's node flags (a heap limit, --cpu-prof) apply to its shells too.
    execArgv: ts ? [...process.execArgv.filter((a) => a !== '--import' && a !== 'tsx'), '--import', 'tsx'] : process.execArgv,
  };
}

export async function startCluster(config: ServeConfig, server: RunningServer, log: Logger): Promise<RunningCluster> {
  const { exec, execArgv } = shellEntry();
  cluster.setupPrimary({ exec, execArgv, serialization: 'advanced' });
  const shells = new Map<number, ShellState>();
  let closing = false;
  /** Every shell has listened once: from then on a shell that dies is replaced. */
  let up = false;
  let replaced = 0;
  let publicUrl: string | null = null;
  let startError: Error | null = null;

  const infoOf = (id: string | undefined, s?: ShellState): ShellWorkerInfo[] => {
    const w = id ? server.workers.get(id) : undefined;
    if (w && s) {
      if (s.told.has(w)) return [];
      s.told.add(w);
    }
    return w
      ? [
          {
            id: w.id,
            url: w.url,
            sourceKeys: w.sourceKeys,
            bootstrapPort: w.bootstrapPort,
            ...(w.spec.appProtocol === 'h2c' ? { appProtocol: 'h2c' as const } : {}),
            handoffSettings: w.handoffFields.settings,
          },
        ]
      : [];
  };
  const send = (s: ShellState, m: PrimaryMessage) => s.outbox.push(m);
  const noteRouted = server.inference.noteRouted;
  const answer = (s: ShellState, id: string, wait: (signal: AbortSignal) => Promise<NextStep>) => {
    // What Lifecycle.wait reads of an AbortSignal, without an AbortController and its AbortSignal per submission:
    // nearly every step is decided at once (issue 29: the two objects were ~2% of the primary's CPU).
    const cancel = new ClientCancel();
    s.waiting.set(id, cancel);
    if (!s.active.has(id)) s.active.set(id, 'unknown');
    void wait(cancel.flowSignal).then((step) => {
      s.waiting.delete(id);
      if (step.kind !== 'dispatch') {
        s.active.delete(id); // refused or aborted: nothing left to finish
        send(s, { k: 'kvr.step', id, step, workers: [] });
        return;
      }
      // What one process notes as its handler takes the attempt (src/server/inference.ts dispatched): the event-stream
      // blindness accounting and /debug/state's recent decisions. The primary made the decision: no message back.
      try {
        noteRouted(recentDecisionOf(step, s.active.get(id) ?? 'unknown', Date.now()));
      } catch (err) {
        log.error({ err, requestId: id }, 'noting a routed request failed'); // the step still goes: the client waits for it
      }
      // The shell needs the decision's numbers, not its hashes or every candidate's scores: a smaller message; and a
      // worker's connection details only the first time.
      const workers = [...infoOf(step.workerId, s), ...infoOf(step.prefill?.workerId, s)];
      send(s, { k: 'kvr.step', id, step: wireStep(step), workers });
    });
  };
  const onMessage = (s: ShellState, m: ShellMessage): void => {
    const lc = server.lifecycle;
    switch (m.k) {
      case 'kvr.batch':
        return; // unpacked by the listener
      case 'kvr.submit':
        // Hashed in the shell: with the adapter routing uses now, or the shell hashes again (a model became an adapter,
        // or stopped being one, since the shell learnt it).
        if (m.sub.seqHashes) {
          const lora = server.dispatcher.hashLoraOf(m.sub, Date.now());
          if (lora !== (m.lora ?? null)) {
            rehashed.inc();
            send(s, { k: 'kvr.rehash', id: m.id, lora });
            return;
          }
        }
        s.active.set(m.id, m.api);
        answer(s, m.id, (signal) => lc.submit(m.sub, signal));
        return;
      case 'kvr.failed':
        answer(s, m.id, (signal) => lc.failed(m.id, m.error, signal));
        return;
      case 'kvr.prefillFailed':
        answer(s, m.id, (signal) => lc.prefillFailed(m.id, m.error, signal));
        return;
      case 'kvr.cancel': {
        // Waiting: the dispatcher takes it back. Already dispatched (the step crossed the shell's cancel): finished.
        const waiting = s.waiting.get(m.id);
        if (waiting) waiting.abort();
        else if (s.active.delete(m.id)) lc.finish(m.id, { outcome: 'cancelled' });
        return;
      }
      case 'kvr.target':
        void server.inference
          .tokenizingWorker(m.model)
          .then((w) => send(s, { k: 'kvr.target', id: m.id, worker: infoOf(w?.id)[0] ?? null }));
        return;
      case 'kvr.prefillDone':
        lc.prefillDone(m.id, m.report);
        return;
      case 'kvr.firstToken':
        lc.firstToken(m.id);
        return;
      case 'kvr.finish':
        if (m.firstToken) lc.firstToken(m.id);
        s.active.delete(m.id);
        lc.finish(m.id, m.report, m.outputTokens);
        return;
      case 'kvr.snapshot':
        s.metrics = m.metrics;
        return;
      case 'kvr.cacheInfo':
        s.metrics = m.metrics;
        cacheAnswers.get(m.id)?.(m.cache ?? undefined);
        return;
      case 'kvr.ready':
        // A shell forked (a replacement) just before the router began to stop is told to stop, not to start.
        if (closing) {
          send(s, { k: 'kvr.close', graceMs: 0 });
          return;
        }
        s.started = true;
        send(s, { k: 'kvr.start', config, primaryUrl: server.url });
        return;
      case 'kvr.startFailed':
        if (!up) startError ??= new Error(m.message);
        else log.error({ pid: s.worker.process.pid, error: m.message }, 'HTTP shell failed to start');
        return;
      case 'kvr.listening':
        s.listening = true;
        publicUrl ??= m.url;
        if (up) log.info({ pid: s.worker.process.pid }, `replacement HTTP shell ${s.worker.process.pid} listening`);
        return;
    }
  };

  // router_tokenizer_cache_*: the shells tokenize, so the series add up their caches, asked at scrape time (a shell
  // that does not answer within a second is left out of that scrape). The same answer brings the shell's request
  // metrics (s.metrics); one question per shell serves every reader of one scrape.
  const cacheAnswers = new Map<number, (c: TokenizerCacheGauges | undefined) => void>();
  let cacheSeq = 0;
  let asking: Promise<(TokenizerCacheGauges | undefined)[]> | null = null;
  const askAll = (): Promise<(TokenizerCacheGauges | undefined)[]> =>
    (asking ??= Promise.all([...shells.values()].filter((s) => s.listening).map(askCache)).finally(() => {
      asking = null;
    }));
  const askCache = (s: ShellState): Promise<TokenizerCacheGauges | undefined> =>
    new Promise((resolve) => {
      const id = ++cacheSeq;
      const timer = setTimeout(() => done(undefined), 1000);
      const done = (c: TokenizerCacheGauges | undefined) => {
        clearTimeout(timer);
        cacheAnswers.delete(id);
        resolve(c);
      };
      cacheAnswers.set(id, done);
      send(s, { k: 'kvr.cacheInfo', id });
    });
  const shellCaches = async () => sumCaches(await askAll());
  server.tokenizerCaches.add(shellCaches);

  // The request metrics the shells record (src/metrics/shell-metrics.ts), summed into /metrics and the dashboard: every
  // shell's latest report (a shell that did not answer this scrape counts with its previous one), and what the shells
  // that exited had reported (so a counter never goes back when its shell dies; a shell killed outright loses what it
  // recorded after its last report: at most a second, or since the last scrape).
  let retired: MetricJson[][] = [];
  const retiredTotals = emptyTotals();
  const retire = (s: ShellState) => {
    const m = s.metrics;
    s.metrics = null;
    if (!m) return;
    const json = parseSnapshot(m);
    if (json) retired.push(json);
    addTotals(retiredTotals, m.totals);
  };
  server.metrics.addRemote({
    metrics: async () => {
      await askAll();
      if (retired.length > 1) retired = [await AggregatorRegistry.aggregate(retired).getMetricsAsJSON()];
      const live = [...shells.values()].flatMap((s) => (s.metrics ? [parseSnapshot(s.metrics)] : [])).filter((j) => j !== null);
      return [...retired, ...live];
    },
    totals: () => [retiredTotals, ...[...shells.values()].flatMap((s) => (s.metrics ? [s.metrics.totals] : []))],
  });

  const dropped = new Counter({
    name: `${server.metrics.prefix}router_shell_messages_dropped_total`,
    help: 'IPC messages from the HTTP shells of --processes the routing core could not act on (malformed): dropped.',
    registers: [server.metrics.registry],
  });
  const rehashed = new Counter({
    name: `${server.metrics.prefix}router_shell_rehashes_total`,
    help:
      'Submissions an HTTP shell of --processes hashed with another LoRA adapter than routing uses (the model became ' +
      'an adapter, or stopped being one, since the shell learnt it): sent back to be hashed again.',
    registers: [server.metrics.registry],
  });
  /** A malformed message: counted, logged, and a request it names refused at once (its client gets an error). */
  const drop = (s: ShellState, m: unknown, problem: string) => {
    dropped.inc();
    log.warn({ pid: s.worker.process.pid, problem }, 'malformed message from an HTTP shell dropped');
    const id = (m as { id?: unknown } | null)?.id;
    const kind = (m as { k?: unknown } | null)?.k;
    if (typeof id !== 'string' || !(kind === 'kvr.submit' || kind === 'kvr.failed' || kind === 'kvr.prefillFailed')) return;
    const refusal: NextStep = {
      kind: 'reject',
      requestId: id,
      // 502, as when the routing core does not answer a forwarded request: the router's own failure.
      code: 'upstream_failed',
      message: `the routing core could not read the request (${problem})`,
      queuedMs: 0,
      attempts: 0,
      tenant: 'default',
      band: 'default',
    };
    send(s, { k: 'kvr.step', id, step: refusal, workers: [] });
  };

  const fork = (): ShellState => {
    const worker = cluster.fork();
    const outbox = new Outbox<PrimaryMessage>((m) => {
      if (worker.isConnected()) worker.send(m);
    });
    const s: ShellState = {
      worker,
      waiting: new Map(),
      active: new Map(),
      told: new WeakSet(),
      outbox,
      started: false,
      listening: false,
      metrics: null,
    };
    shells.set(worker.id, s);
    worker.on('message', (m: unknown) => {
      if (!isShellMessage(m)) return;
      for (const one of m.k === 'kvr.batch' ? (Array.isArray(m.msgs) ? m.msgs : [null]) : [m]) {
        // After the shell's exit the channel may still hand over what it wrote before it died: its requests were
        // finished as cancelled at the exit (exactly once), and its metrics were retired with the report it had made.
        if (!shells.has(worker.id)) continue;
        const problem = shellMessageProblem(one, config.blockSize);
        if (problem) {
          drop(s, one, problem);
          continue;
        }
        try {
          onMessage(s, one);
        } catch (err) {
          log.error({ err, message: one.k }, 'HTTP shell message failed');
        }
      }
    });
    worker.once('exit', (code, signal) => {
      shells.delete(worker.id);
      retire(s);
      // What it had in flight is over: its clients lost their connections with it.
      for (const ac of s.waiting.values()) ac.abort();
      for (const id of s.active.keys()) if (!s.waiting.has(id)) server.lifecycle.finish(id, { outcome: 'cancelled' });
      s.active.clear();
      if (closing) return;
      if (!up) {
        // Start-up failed (the port taken, the tokenizer unreadable): no replacing, the command fails.
        closing = true;
        for (const other of shells.values()) other.worker.kill('SIGKILL');
        startError ??= new Error(`an HTTP shell exited before listening (${signal ?? `exit ${code}`})`);
        return;
      }
      replaced++;
      const next = fork();
      log.warn(
        { pid: worker.process.pid, code, signal, replacement: next.worker.process.pid },
        `HTTP shell ${worker.process.pid} exited (${signal ?? `exit ${code}`}): replaced by ${next.worker.process.pid}`,
      );
    });
    return s;
  };

  for (let i = 0; i < config.processes; i++) fork();
  // Every shell listens before the router says it is up; any that cannot fails the start-up.
  while (!startError && (shells.size < config.processes || [...shells.values()].some((s) => !s.listening))) {
    await new Promise((r) => setTimeout(r, 10));
  }
  if (startError || !publicUrl) {
    closing = true;
    for (const s of shells.values()) s.worker.kill('SIGKILL');
    throw startError ?? new Error('no HTTP shell listened');
  }
  const url: string = publicUrl;
  up = true;
  log.info({ shells: [...shells.values()].map((s) => s.worker.process.pid) }, `${config.processes} HTTP shells listening on ${url}`);

  return {
    url,
    shellPids: () => [...shells.values()].map((s) => s.worker.process.pid as number),
    replaced: () => replaced,
    close: async (graceMs) => {
      closing = true;
      // Queued requests are refused at once, as one process does (app.ts close): those in flight get the grace period.
      // Left queued, a shell's drain waited for each to reach a worker and run to its end, up to the whole grace.
      server.lifecycle.close();
      const exits = [...shells.values()].map(
        (s) =>
          new Promise<void>((resolve) => {
            if (s.worker.isDead()) return resolve();
            // Not started (a replacement still loading its modules): it holds nothing, and would only read kvr.close
            // once booted.
            if (!s.started) {
              s.worker.once('exit', () => resolve());
              s.worker.process.kill('SIGKILL');
              return;
            }
            const kill = setTimeout(() => {
              log.warn({ pid: s.worker.process.pid, graceMs }, 'an HTTP shell did not stop within the grace period: killed');
              s.worker.kill('SIGKILL');
            }, graceMs + 5_000).unref();
            s.worker.once('exit', () => {
              clearTimeout(kill);
              resolve();
            });
            send(s, { k: 'kvr.close', graceMs });
          }),
      );
      await Promise.all(exits);
    },
  };
}
