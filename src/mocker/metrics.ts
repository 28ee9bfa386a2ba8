/**
 * The engine metrics vLLM serves on /metrics, by vLLM's names, labels (`model_name`, `engine` = DP rank) and help texts:
 * prefix cache queries and hits in tokens, prompt and generation tokens, preemptions, running and waiting requests, KV
 * usage, the cache config info gauge, and TTFT and end-to-end latency histograms (in modelled seconds).
 */
import type { ServerResponse } from 'node:http';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { EngineConfig, MockEngine } from './engine/index.ts';

const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const E2E_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680];

export class EngineMetrics {
  readonly registry = new Registry();
  private readonly ttft: Histogram;
  private readonly e2e: Histogram;
  private readonly labels: { model_name: string; engine: string }[];

  constructor(model: string, engines: readonly MockEngine[], cfg: EngineConfig) {
    const reg = this.registry;
    this.labels = engines.map((_, r) => ({ model_name: model, engine: String(r) }));
    const labelNames = ['model_name', 'engine'] as const;
    const labels = this.labels;
    // Counters and gauges are read from the engines at scrape time, so they can never drift from the engine's state.
    const counter = (name: string, help: string, pick: (e: MockEngine) => number) =>
      new Counter({
        name,
        help,
        labelNames,
        registers: [reg],
        collect() {
          this.reset();
          for (const [r, e] of engines.entries()) this.inc(labels[r], pick(e));
        },
      });
    const gauge = (name: string, help: string, pick: (e: MockEngine) => number) =>
      new Gauge({
        name,
        help,
        labelNames,
        registers: [reg],
        collect() {
          for (const [r, e] of engines.entries()) this.set(labels[r], pick(e));
        },
      });
    counter(
      'vllm:prefix_cache_queries_total',
      'Prefix cache queries, in terms of number of queried tokens.',
      (e) => e.counters.prefixCacheQueries,
    );
    counter('vllm:prefix_cache_hits_total', 'Prefix cache hits, in terms of number of cached tokens.', (e) => e.counters.prefixCacheHits);
    counter('vllm:prompt_tokens_total', 'Number of prefill tokens processed.', (e) => e.counters.promptTokens);
    counter('vllm:generation_tokens_total', 'Number of generation tokens processed.', (e) => e.counters.generationTokens);
    counter('vllm:num_preemptions_total', 'Cumulative number of preemption from the engine.', (e) => e.counters.preemptions);
    gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', (e) => e.numRunning);
    gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', (e) => e.numWaiting);
    gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', (e) => e.kvUsage);
    new Gauge({
      name: 'vllm:cache_config_info',
      help: 'Information of the LLMEngine CacheConfig',
      labelNames: ['model_name', 'engine', 'block_size', 'num_gpu_blocks', 'enable_prefix_caching', 'cache_dtype', 'num_cpu_blocks'],
      registers: [reg],
      collect() {
        for (const l of labels) {
          this.set(
            {
              ...l,
              block_size: String(cfg.blockSize),
              num_gpu_blocks: String(cfg.numGpuBlocks),
              enable_prefix_caching: cfg.enablePrefixCaching ? 'True' : 'False',
              cache_dtype: 'auto',
              num_cpu_blocks: 'None',
            },
            1,
          );
        }
      },
    });
    this.ttft = new Histogram({
      name: 'vllm:time_to_first_token_seconds',
      help: 'Histogram of time to first token in seconds.',
      labelNames,
      buckets: TTFT_BUCKETS,
      registers: [reg],
    });
    this.e2e = new Histogram({
      name: 'vllm:e2e_request_latency_seconds',
      help: 'Histogram of e2e request latency in seconds.',
      labelNames,
      buckets: E2E_BUCKETS,
      registers: [reg],
    });
  }

  observeTtft(rank: number, seconds: number): void {
    this.ttft.observe(this.labels[rank], seconds);
  }

  observeE2e(rank: number, seconds: number): void {
    this.e2e.observe(this.labels[rank], seconds);
  }

  /** `GET /metrics`: Prometheus text. */
  async serve(res: ServerResponse): Promise<void> {
    const text = await this.registry.metrics();
    res.writeHead(200, { 'content-type': this.registry.contentType });
    res.end(text);
  }

  /** A restart: histograms back to empty (counters and gauges follow the reset engines). */
  reset(): void {
    this.registry.resetMetrics();
  }
}
