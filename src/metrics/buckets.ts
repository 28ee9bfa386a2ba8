/** Histogram buckets shared by the metric families. */

/** 0, 0.05, ..., 1.0 (21 buckets), rounded so the `le` labels print as 0.05, not 0.05000000000000001. */
export const HIT_RATE_BUCKETS = Array.from({ length: 21 }, (_, i) => Math.round(i * 5) / 100);
/** Seconds, from 10 µs (hashing a short prompt) to 1 s (tokenizing a very long one on a loaded box). */
export const OVERHEAD_BUCKETS = [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1];
export const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
export const ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5];
export const LENGTH_BUCKETS = [16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144];
/** Predicted minus delivered cached tokens: symmetric, since the router can be wrong both ways. */
export const PREDICTION_ERROR_BUCKETS = [-65536, -16384, -4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096, 16384, 65536];

/** A histogram's running sum and count, for the dashboard (prom-client's async get() is too heavy for its poll). */
export interface SumCount {
  sum: number;
  count: number;
}
