/**
 * Step duration models (docs/protocols.md §7). A step's cost is split in a prefill part (new tokens of requests still
 * prefilling, including recompute after preemption) and a decode part (one token per decoding request); a mixed step pays
 * both, which slightly overcharges the fixed terms but keeps the models as published.
 */

/** Published polynomial fit: cheap, ignores attention over the cached prefix (long agentic turns come out too cheap). */
export interface PolynomialTiming {
  readonly kind: 'polynomial';
  /** prefill_ms = a2·T² + a1·T + a0, T = new prefill tokens in the step. */
  readonly prefill: readonly [a2: number, a1: number, a0: number];
  /** decode_ms = max(decodeMinMs, b2·p² + b1·p + b0), p = KV usage fraction. */
  readonly decode: readonly [b2: number, b1: number, b0: number];
  readonly decodeMinMs: number;
}

/** First-principles roofline: prefill is compute-bound (weights + attention over prefix), decode memory-bound. */
export interface FirstPrinciplesTiming {
  readonly kind: 'first-principles';
  /** Model parameters P. */
  readonly params: number;
  /** Layers L. */
  readonly layers: number;
  /** Attention width d (heads · head_dim). */
  readonly attnWidth: number;
  readonly bytesPerWeight: number;
  /** KV bytes per token of context (2 · layers · kv_heads · head_dim · bytes). */
  readonly kvBytesPerToken: number;
  readonly gpus: number;
  /** Peak FLOP/s per GPU. */
  readonly peakFlops: number;
  readonly mfu: number;
  /** HBM bytes/s per GPU. */
  readonly hbmBandwidth: number;
  readonly memEfficiency: number;
  readonly c0Ms: number;
  readonly c1Ms: number;
}

export type TimingModel = PolynomialTiming | FirstPrinciplesTiming;

export const DEFAULT_POLYNOMIAL: PolynomialTiming = {
  kind: 'polynomial',
  prefill: [4.21e-7, 1.518e-2, 16.5],
  decode: [-25.74, 54.01, 5.74],
  decodeMinMs: 1,
};

/** An 8B model (Qwen3-8B shape) in bf16 on one H100: ~435k cacheable tokens, 8k cold prefill ≈ 0.35 s. */
export const DEFAULT_FIRST_PRINCIPLES: FirstPrinciplesTiming = {
  kind: 'first-principles',
  params: 8e9,
  layers: 36,
  attnWidth: 4096,
  bytesPerWeight: 2,
  kvBytesPerToken: 2 * 36 * 8 * 128 * 2,
  gpus: 1,
  peakFlops: 989e12,
  mfu: 0.45,
  hbmBandwidth: 3.35e12,
  memEfficiency: 0.7,
  c0Ms: 15,
  c1Ms: 3,
};

/** What one step computed, as the timing models need it. */
export interface StepWork {
  /** New tokens of prefilling requests (T). */
  prefillTokens: number;
  /** Σ over prefill chunks of new · (2·prefix + new): the attention term. */
  prefillAttnTokens2: number;
  /** Requests that decoded one token. */
  decodeRequests: number;
  /** Σ context tokens of the decoding requests (KV read per step). */
  decodeContextTokens: number;
  /** KV usage fraction after allocation. */
  kvUsage: number;
}

export function stepDurationMs(model: TimingModel, w: StepWork): number {
  let ms = 0;
  if (model.kind === 'polynomial') {
    if (w.prefillTokens > 0) {
      const [a2, a1, a0] = model.prefill;
      const T = w.prefillTokens;
      ms += a2 * T * T + a1 * T + a0;
    }
    if (w.decodeRequests > 0) {
      const [b2, b1, b0] = model.decode;
      const p = w.kvUsage;
      ms += Math.max(model.decodeMinMs, b2 * p * p + b1 * p + b0);
    }
    return ms;
  }
  const m = model;
  if (w.prefillTokens > 0) {
    const flops = 2 * m.params * w.prefillTokens + 2 * m.layers * m.attnWidth * w.prefillAttnTokens2;
    ms += m.c0Ms + (flops / (m.gpus * m.peakFlops * m.mfu)) * 1000;
  }
  if (w.decodeRequests > 0) {
    const bytes = m.params * m.bytesPerWeight + w.decodeContextTokens * m.kvBytesPerToken;
    ms += m.c1Ms + (bytes / (m.gpus * m.hbmBandwidth * m.memEfficiency)) * 1000;
  }
  return ms;
}
