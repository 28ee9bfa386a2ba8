/**
 * A submitted request lets its parsed body go once the front end has what its attempts need (release()), and reads
 * it again from the bytes when asked after that: the same JSON, text and parsed request. Once released, nothing of the
 * flow's own keeps the parsed body alive while the attempt waits for its answer (a suspended async frame keeps its
 * locals: runRequest's parse lives in a frame that ends at the submission).
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { completionsApi } from '../../src/apis/openai.ts';
import type { DispatchAttempt } from '../../src/core/dispatch/dispatcher.ts';
import { type FlowContext, runRequest, type SubmittedRequest } from '../../src/runtime/request-flow.ts';

function context(): FlowContext<{ id: string }> {
  const attempt = { kind: 'dispatch', requestId: 'q1', workerId: 'w0', attempt: 0 } as unknown as DispatchAttempt;
  return {
    config: { maxJsonDepth: 64, mmPlaceholderTokens: 0, mmPlaceholderTokenId: 0 },
    log: { debug: () => {}, warn: () => {} },
    precheck: () => null,
    tokenizer: null,
    remote: null,
    tokenizingWorker: async () => undefined,
    lifecycle: { submit: async () => attempt } as unknown as FlowContext<{ id: string }>['lifecycle'],
    workers: { get: (id) => ({ id }) },
    metrics: { refused: () => {}, outcome: () => {} },
    guard: { tenantOf: () => null },
    sessionHeaders: [],
    nextRequestId: () => 'q1',
  };
}

describe('SubmittedRequest.release', () => {
  it('reads the same body, text and parsed request from the bytes after it let them go', async () => {
    const text = '{"model":"m","prompt":[5,6,7,8],"stream":true,"max_tokens":3,"note":"é"}';
    const seen: { before: unknown[]; after: unknown[]; same: boolean[] } = { before: [], after: [], same: [] };
    const read = (r: SubmittedRequest) => [r.json, r.text, r.parsed.model, r.parsed.stream, r.parsed.stripUsage, r.parsed.prompt];
    const result = await runRequest(
      context(),
      { api: completionsApi, body: Buffer.from(text), headers: {}, signal: new AbortController().signal },
      {
        send: async (_a, _w, _p, r) => {
          seen.before = read(r);
          const json = r.json;
          r.release();
          seen.after = read(r);
          // Parsed again: a new object, equal to the first.
          const again = r.json;
          seen.same = [again === json, again === r.json];
          expect(r.parsed.upstreamBytes?.(r.raw)?.toString()).toBe(`${text.slice(0, -1)},"stream_options":{"include_usage":true}}`);
          return { kind: 'done' };
        },
      },
    );
    expect(result).toEqual({ kind: 'answered' });
    expect(seen.before[1]).toBe(text);
    expect(seen.after).toEqual(seen.before);
    expect(seen.same).toEqual([false, true]);
  });

  it('while the attempt waits for its answer, the released body is garbage: no frame of the flow holds it', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const text = JSON.stringify({ model: 'm', prompt: [5, 6, 7, 8], note: 'x'.repeat(64) });
    let alive: boolean[] = [];
    const result = await runRequest(
      context(),
      { api: completionsApi, body: Buffer.from(text), headers: {}, signal: new AbortController().signal },
      {
        send: async (_a, _w, _p, r) => {
          const refs = [new WeakRef(r.json), new WeakRef(r.parsed)];
          r.release();
          // The answer is awaited: every frame of the flow is suspended, as in serve.
          await new Promise((resolve) => setTimeout(resolve, 10));
          gc();
          alive = refs.map((w) => w.deref() !== undefined);
          return { kind: 'done' };
        },
      },
    );
    expect(result).toEqual({ kind: 'answered' });
    expect(alive).toEqual([false, false]);
  });
});
