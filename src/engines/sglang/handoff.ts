/**
 * SGLang's disaggregated handoff (bootstrap), as SGLang's routers speak it (sgl-project/sglang
 * sgl-router/py_src/sglang_router/mini_lb.py @097e50bcbd22; lightseekorg/smg model_gateway/src/routers/http/pd_router.rs
 * @73da68ca9472): both legs carry the client's body + bootstrap_host (the prefill worker's host, IPv6 bracketed),
 * bootstrap_port and a random bootstrap_room in [0, 2^63), and are sent at once.
 *
 * Data-parallel ranks (docs/engines.md "SGLang DP ranks"): the room is drawn ≡ the prefill's chosen rank (mod its DP
 * size), which every release's default `follow_bootstrap_room` dispatch honours. On top of it, as smg does, the
 * prefill leg carries `routed_dp_rank` = its rank and the decode leg `routed_dp_rank` = the decode rank and
 * `disagg_prefill_dp_rank` = the prefill rank (sgl-project/sglang#19268); the x-data-parallel-rank header (#19832) is
 * set by the sender with the same ranks. `data_parallel_rank`, the older name, is never sent: releases between #10169
 * and #19268 read it on the decode side as the *prefill* rank, so the decode rank there would break the KV transfer.
 */
import { randomBytes } from 'node:crypto';
import { appendMembers } from '../raw-json.ts';
import type { BootstrapHandoff, HandoffPair } from '../handoff.ts';

const ROOM_MASK = (1n << 63n) - 1n;

/** A random bootstrap room in [0, 2^63) whose residue mod the prefill's DP size is the chosen rank. */
export function bootstrapRoom(dpSize: number, rank: number): bigint {
  let room = randomBytes(8).readBigUInt64BE() & ROOM_MASK;
  if (dpSize > 1) {
    const dp = BigInt(dpSize);
    room = room - (room % dp) + BigInt(rank);
    if (room > ROOM_MASK) room -= dp;
  }
  return room;
}

/** The three bootstrap fields added to `base` (a JSON object's text). */
export function sglangBody(base: string, host: string, port: number, room: bigint, extra: [string, string][] = []): string {
  return appendMembers(base, [
    ['bootstrap_host', JSON.stringify(host)],
    ['bootstrap_port', String(port)],
    ['bootstrap_room', room.toString()],
    ...extra,
  ]);
}

/** Both legs' bodies of one pair (one room). */
export function sglangBodies(base: string, pair: HandoffPair): { prefill: string; decode: string } {
  const { prefill, decode } = pair;
  const host = new URL(prefill.url).hostname;
  const room = bootstrapRoom(prefill.ranks, prefill.rank);
  const prefillRank: [string, string][] = prefill.ranks > 1 ? [['routed_dp_rank', String(prefill.rank)]] : [];
  const decodeRanks: [string, string][] = [
    ...(decode.ranks > 1 ? ([['routed_dp_rank', String(decode.rank)]] as [string, string][]) : []),
    ...(prefill.ranks > 1 ? ([['disagg_prefill_dp_rank', String(prefill.rank)]] as [string, string][]) : []),
  ];
  return {
    prefill: sglangBody(base, host, prefill.bootstrapPort, room, prefillRank),
    decode: sglangBody(base, host, prefill.bootstrapPort, room, decodeRanks),
  };
}

export const sglangHandoff: BootstrapHandoff = {
  flow: 'bootstrap',
  bodies: (client, pair) => sglangBodies(client.upstreamBody, pair),
};
