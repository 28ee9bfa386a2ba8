/**
 * The HTTP workloads of the proxy benchmarks (bench:capacity, bench:callgrind): completions given as token ids, and
 * streamed chats with a long system prompt (warm: one prompt shared; cold: each request's starts differently), and the
 * seeded English-like prose they (and bench:memory, soak, with their own word lists) are written in.
 */

export interface Workload {
  readonly name: string;
  readonly path: string;
  /** The n-th request's body. */
  readonly body: (n: number) => string;
}

/** Completions with `ids` token ids: 64 distinct prompts, cycled; `chunks` tokens asked for. */
export function idsWorkload(ids: number, chunks: number, stream: boolean): Workload {
  // Distinct prompts (the first ids differ), so no two requests are the same; 64 of them, cycled.
  const bodies = Array.from({ length: 64 }, (_, k) =>
    JSON.stringify({
      model: 'bench',
      stream,
      prompt: Array.from({ length: ids }, (_, i) => ((i * 7919 + k * 104729) % 150000) + 1),
      max_tokens: chunks,
    }),
  );
  return { name: `ids ${ids}${stream ? ' stream' : ''}`, path: '/v1/completions', body: (n) => bodies[n % bodies.length] };
}

/** The word list of prose(). */
export const WORDS =
  'the a of to and in is it you that he was for on are with as his they be at one have this from or had by hot word but what some we can out other were all there when up use your how said an each she which do their time if will way about many then them write would like so these her long make thing see him two has look more day could go come did number sound no most people my over know water than call first who may down side been now find any new work part take get place made live where after back little only round man year came show every good me give our under name very through just form sentence great think say help low line differ turn cause much mean before move right boy old too same tell does set three want air well also play small end put home read hand port large spell add even land here must big high such follow act why ask men change went light kind off need house picture try us again animal point mother world near build self earth father'.split(
    ' ',
  );

/** ~`tokens` tokens of English-like text from a seeded stream of `words` (no repeats of long runs); with `sentences`, a ".\n" after every 17th word. */
export function prose(tokens: number, seed: number, words: readonly string[] = WORDS, sentences = true): string {
  let x = seed >>> 0 || 1;
  const out: string[] = [];
  for (let i = 0; i < tokens * 0.8; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out.push(words[x % words.length]);
    if (sentences && i % 17 === 16) out.push('.\n');
  }
  return out.join(' ');
}

/**
 * Streamed chat with `system` as the system prompt and a distinct user turn per request; `chunks` tokens asked for.
 */
export function chatWorkload(system: string, chunks: number, cold = false): Workload {
  const user = (n: number) =>
    `Question ${n}: what is ${n % 97} times ${(n * 31) % 89}, and why does the ${WORDS[n % WORDS.length]} matter?`;
  // Cold: each request's system prompt starts differently, so the prefix cache of the tokenizer misses (and so does
  // the routing index); warm: one system prompt, distinct user turns.
  const body = (n: number) =>
    JSON.stringify({
      model: 'bench',
      stream: true,
      max_tokens: chunks,
      messages: [
        { role: 'system', content: cold ? `Session ${n}-${(n * 2654435761) >>> 0}. ${system}` : system },
        { role: 'user', content: user(n) },
      ],
    });
  return { name: cold ? 'chat cold' : 'chat warm', path: '/v1/chat/completions', body };
}
