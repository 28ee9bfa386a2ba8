/**
 * SGLang's disaggregated handoff, engine side, for the mock engine, with the data-parallel rank read as a chosen SGLang
 * release reads it (`SglangDpRouting`; docs/engines.md "SGLang DP ranks"):
 *
 * - `header` (sgl-project/sglang#19832, merged 2026-03-04; v0.5.19 measured in #38729): the x-data-parallel-rank header,
 *   else the body's routed_dp_rank, else its deprecated data_parallel_rank, else bootstrap_room mod the DP size; the
 *   decode side takes the prefill rank from disagg_prefill_dp_rank, else from the bootstrap server (always right);
 * - `body` (#19268, merged 2026-02-24, until #19832): the same without the header;
 * - `legacy-body` (#6884, 2025-06, until #19268): data_parallel_rank, else the room; the decode side takes
 *   data_parallel_rank as the *prefill* rank to fetch from (#10169), else room mod the prefill's DP size;
 * - `room` (before #6884): bootstrap_room mod the DP size only, on both sides.
 *
 * The files those pull requests change (sgl-project/sglang, python/sglang/srt/): entrypoints/openai/serving_base.py
 * `extract_routed_dp_rank_from_header` with serving_chat.py and serving_completions.py (#19832);
 * managers/data_parallel_controller.py `maybe_external_dp_rank_routing` and disaggregation/decode.py
 * `_resolve_prefill_dp_rank` (#19268); disaggregation/decode.py `prefill_dp_rank=req.data_parallel_rank` (#10169). Their
 * merge commits are not pinned: the source index holds only older copies (serving_base.py @012bcb5f987e reads no
 * header) and the repository is past the snapshot size this project can fetch.
 *
 * prefill  a request with bootstrap_room waits for its room's decode side on the bootstrap server (the
 *          SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT), then prefills one token and hands the KV over, from its rank
 * decode   a request with bootstrap_host/port/room asks that bootstrap server for the room's KV, naming the prefill
 *          rank it expects when its release names one; a wrong rank finds no KV (the real engine's transfer fails)
 */
import { rawMember } from '../raw-json.ts';
import type { MockHandoff, MockPdHost, MockRankRequest, PdPlan } from '../mock-handoff.ts';
import type { SglangDpRouting } from './dp-routing.ts';

export { SGLANG_DP_ROUTINGS, type SglangDpRouting } from './dp-routing.ts';

const rankIn = (v: unknown, ranks: number): number | null =>
  Number.isInteger(v) && (v as number) >= 0 && (v as number) < ranks ? (v as number) : null;

function roomOf(raw: string): bigint | null {
  const text = rawMember(raw, 'bootstrap_room');
  return text !== undefined && /^\d+$/.test(text) ? BigInt(text) : null;
}

/** The rank a request runs on, as the release modelled picks it; null: SGLang's default (here: the least loaded). */
export function sglangRank(ranks: number, routing: SglangDpRouting, req: MockRankRequest): number | null {
  if (routing === 'header' && req.header !== undefined && req.header !== '') {
    const n = Number(req.header);
    if (Number.isInteger(n) && n >= 0 && n < ranks) return n;
  }
  if (routing === 'header' || routing === 'body') {
    const r = rankIn(req.body.routed_dp_rank, ranks) ?? rankIn(req.body.data_parallel_rank, ranks);
    if (r !== null) return r;
  }
  if (routing === 'legacy-body') {
    const r = rankIn(req.body.data_parallel_rank, ranks);
    if (r !== null) return r;
  }
  const room = roomOf(req.raw);
  return room === null || ranks <= 1 ? null : Number(room % BigInt(ranks));
}

/**
 * The prefill rank a decode request fetches its KV from, as its release decides it: a rank, 'room' (bootstrap_room
 * mod the prefill's DP size, which the bootstrap server knows), or null (the bootstrap server says where it is).
 */
export function expectedPrefillRank(routing: SglangDpRouting, body: Record<string, unknown>): number | 'room' | null {
  if (routing === 'header' || routing === 'body')
    return Number.isInteger(body.disagg_prefill_dp_rank) ? (body.disagg_prefill_dp_rank as number) : null;
  if (routing === 'legacy-body' && Number.isInteger(body.data_parallel_rank)) return body.data_parallel_rank as number;
  return 'room';
}

export const sglangMock: MockHandoff = {
  name: 'sglang',
  rank: (host, req) => sglangRank(host.ranks, host.options.sglangDpRouting ?? 'header', req),
  async plan(host: MockPdHost, leg): Promise<PdPlan | null> {
    const roomText = rawMember(leg.raw, 'bootstrap_room');
    if (roomText === undefined || !/^\d+$/.test(roomText)) return null;
    if (leg.role === 'prefill') {
      const r = host.room(roomText);
      r.prefillRank = leg.rank;
      const arrived = await Promise.race([r.decodeArrived.then(() => true), host.sleep(host.bootstrapTimeoutMs).then(() => false)]);
      if (!arrived || leg.closed()) {
        host.dropRoom(roomText);
        if (!arrived) host.stats.bootstrapTimeouts++;
        r.ready({ error: arrived ? 'the prefill request was cancelled' : 'bootstrap timeout' });
        return { failure: arrived ? 'cancelled' : `bootstrap timeout: no decode side for room ${roomText}` };
      }
      return {
        maxTokens: 1,
        onComplete: () => {
          host.dropRoom(roomText);
          r.ready({ numTokens: leg.prompt.length });
        },
      };
    }
    const { bootstrap_host: bHost, bootstrap_port: bPort } = leg.body;
    if (typeof bHost !== 'string' || typeof bPort !== 'number')
      return { failure: 'bootstrap_host and bootstrap_port are required with bootstrap_room' };
    const local = leg.localHitTokens();
    const expect = expectedPrefillRank(host.options.sglangDpRouting ?? 'header', leg.body);
    const got = await host.fetchBootstrap(bHost, bPort, roomText, expect);
    if ('error' in got) return { failure: `KV transfer failed: ${got.error}` };
    await host.transfer(Math.max(0, leg.prompt.length - local));
    return { preloadedTokens: leg.prompt.length };
  },
};
