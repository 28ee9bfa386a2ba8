/**
 * soak: mixed chat traffic through `kvroute serve` (the built CLI, its own process) for a long time, watching its memory.
 * Many tenants (x-kvroute-tenant), sessions (x-session-id) growing turn by turn, system prompts of different sizes,
 * streaming and not, against two fast upstreams (bench/lib/fast-upstream.ts) so the router is what works. Every
 * sample interval the router's own /metrics gives its RSS, V8 heap and event-loop lag; the table shows them with the
 * requests served. At the end, a plateau check: memory must stop growing once its caches are full.
 *
 *   npm run soak -- --minutes 30 [--sample-s 60 --clients 12 --tenants 500 --sessions 5000 --json]
 */
import { loadavg } from 'node:os';
import { Pool } from 'undici';
import { prose } from './lib/http-workloads.ts';
import { benchArgs, children, KVROUTE_BIN, listeningUrl, QWEN3_DIR, serveArgs, startUpstreamProcess, track } from './lib/proxy-run.ts';

const HELP = `soak: memory and event-loop lag of kvroute serve under long mixed chat traffic

usage: npm run soak -- [options]

  --minutes <n>     how long to run (default 30)
  --sample-s <n>    seconds between samples (default 60)
  --clients <n>     concurrent clients (default 12)
  --tenants <n>     distinct tenants (default 500)
  --sessions <n>    distinct sessions (default 5000)
  --json            print the samples as JSON after the table
  -h, --help        this text

The plateau check compares the largest RSS of the last third of the run with that of the middle third.`;

const { argv, num } = benchArgs('soak', HELP);
const MINUTES = num('minutes', 30);
const SAMPLE_S = num('sample-s', 60);
const CLIENTS = num('clients', 12);
const TENANTS = num('tenants', 500);
const SESSIONS = num('sessions', 5000);
const ADMIN = 'soak-admin';
const progress = (s: string) => process.stderr.write(`[soak] ${s}\n`);

/** The word list of the soak's prose (bench/lib/http-workloads.ts prose() without sentence breaks). */
const WORDS =
  'the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her all she there would their we him been has when who will more no if out so said what up its about into than them can only other new some could time these two may then do first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three'.split(
    ' ',
  );

interface Sample {
  minute: number;
  requests: number;
  errors: number;
  rssMb: number;
  heapUsedMb: number;
  /** The tokenizer thread's own heap and its segment cache's estimated bytes (bounded by --tokenizer-cache-mb, 64 MiB). */
  tokenizerHeapMb: number;
  tokenizerCacheMb: number;
  /** Dispatcher tables: sessions remembered. */
  sessions: number;
  lagP99Ms: number;
  /** The machine's 1-minute load average (the soak's own generator and upstreams included). */
  load1: number;
}

function metric(text: string, name: string): number {
  const m = new RegExp(`^${name} ([\\d.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : Number.NaN;
}

async function main(): Promise<void> {
  const upstreams: string[] = [];
  for (let i = 0; i < 2; i++) upstreams.push((await startUpstreamProcess(8)).url);
  const kv = track(process.execPath, serveArgs(KVROUTE_BIN, upstreams, ['--tokenizer', QWEN3_DIR, '--admin-token', ADMIN]));
  const url = await listeningUrl(kv);
  progress(`kvroute ${url} (pid ${kv.pid}), upstreams ${upstreams.join(' ')}; ${MINUTES} min, ${CLIENTS} clients`);

  const systems = Array.from({ length: 24 }, (_, i) => prose([200, 800, 2000, 4000][i % 4], 100 + i, WORDS, false));
  const history = new Map<number, { role: string; content: string }[]>();
  const pool = new Pool(url, { connections: CLIENTS, pipelining: 1 });
  let requests = 0;
  let errors = 0;
  let n = 0;
  const end = Date.now() + MINUTES * 60_000;
  const one = async () => {
    const k = n++;
    // Skewed: a few tenants and sessions are busy, most are rare (tables fill with a long tail).
    const tenant = Math.floor(TENANTS * Math.random() ** 2);
    const session = Math.floor(SESSIONS * Math.random() ** 2);
    const turns = history.get(session) ?? [];
    turns.push({ role: 'user', content: `turn ${turns.length} of session ${session}: ${prose(20 + (k % 60), k, WORDS, false)}` });
    const messages = [{ role: 'system', content: systems[session % systems.length] }, ...turns];
    const stream = k % 5 !== 0;
    try {
      const res = await pool.request({
        method: 'POST',
        path: '/v1/chat/completions',
        headers: { 'content-type': 'application/json', 'x-kvroute-tenant': `t-${tenant}`, 'x-session-id': `s-${session}` },
        body: JSON.stringify({ model: 'bench', stream, max_tokens: 8, messages }),
      });
      await res.body.text();
      if (res.statusCode === 200) requests++;
      else errors++;
    } catch {
      errors++;
    }
    turns.push({ role: 'assistant', content: 'ok' });
    history.set(session, turns.length > 16 ? [] : turns); // a conversation ends after 8 turns and starts over
  };
  const clients = Array.from({ length: CLIENTS }, async () => {
    while (Date.now() < end) await one();
  });

  const samples: Sample[] = [];
  console.log(
    '| minute | requests | errors | RSS MB | heap used MB | tokenizer thread heap MB | tokenizer cache MB | sessions | event-loop lag p99 ms | load avg 1 min |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|');
  const t0 = Date.now();
  const sample = async () => {
    const text = await (await fetch(`${url}/metrics`)).text();
    const state = (await (await fetch(`${url}/debug/state`, { headers: { authorization: `Bearer ${ADMIN}` } })).json()) as {
      tokenizer?: { heapUsedBytes?: number; cache?: { bytes?: number } };
      dispatcher?: { sessions?: number };
    };
    const s: Sample = {
      minute: (Date.now() - t0) / 60_000,
      requests,
      errors,
      rssMb: metric(text, 'process_resident_memory_bytes') / 2 ** 20,
      heapUsedMb: metric(text, 'nodejs_heap_size_used_bytes') / 2 ** 20,
      tokenizerHeapMb: (state.tokenizer?.heapUsedBytes ?? Number.NaN) / 2 ** 20,
      tokenizerCacheMb: (state.tokenizer?.cache?.bytes ?? Number.NaN) / 2 ** 20,
      sessions: state.dispatcher?.sessions ?? 0,
      lagP99Ms: metric(text, 'nodejs_eventloop_lag_p99_seconds') * 1000,
      load1: loadavg()[0],
    };
    samples.push(s);
    console.log(
      `| ${s.minute.toFixed(1)} | ${s.requests} | ${s.errors} | ${s.rssMb.toFixed(0)} | ${s.heapUsedMb.toFixed(0)} | ${s.tokenizerHeapMb.toFixed(0)} | ${s.tokenizerCacheMb.toFixed(1)} | ${s.sessions} | ${s.lagP99Ms.toFixed(1)} | ${s.load1.toFixed(1)} |`,
    );
  };
  const timer = setInterval(() => void sample(), SAMPLE_S * 1000);
  await Promise.all(clients);
  clearInterval(timer);
  await sample();
  await pool.close();

  const third = Math.max(1, Math.floor(samples.length / 3));
  const middle = samples.slice(third, 2 * third);
  const last = samples.slice(2 * third);
  const maxRss = (xs: Sample[]) => Math.max(...xs.map((x) => x.rssMb));
  const maxHeap = (xs: Sample[]) => Math.max(...xs.map((x) => x.heapUsedMb));
  if (middle.length > 0 && last.length > 0) {
    const growth = (100 * (maxRss(last) - maxRss(middle))) / maxRss(middle);
    const heapGrowth = (100 * (maxHeap(last) - maxHeap(middle))) / maxHeap(middle);
    console.log(
      `\nplateau check: largest RSS ${maxRss(middle).toFixed(0)} MB in the middle third, ${maxRss(last).toFixed(0)} MB in the last (${growth >= 0 ? '+' : ''}${growth.toFixed(1)}%); ` +
        `heap ${maxHeap(middle).toFixed(0)} -> ${maxHeap(last).toFixed(0)} MB (${heapGrowth >= 0 ? '+' : ''}${heapGrowth.toFixed(1)}%): ${growth < 5 && heapGrowth < 5 ? 'plateau' : 'still growing'}`,
    );
  } else console.log('\nplateau check: too few samples (run longer or sample more often)');
  console.log(`${requests} requests, ${errors} errors, ${CLIENTS} clients, ${TENANTS} tenants, ${SESSIONS} sessions`);
  if (argv.includes('--json')) console.log(JSON.stringify({ samples }, null, 2));
  for (const c of children) c.kill('SIGTERM');
}

await main();
