/**
 * The engine registry: one adapter per engine (src/engines/NAME/), and the list of engine names every other module
 * derives from it (worker specs, discovery annotations, the relay's --flavor, the NATS registry entries, the metrics
 * mirror, event ingestion, the P/D handoff). Adding an engine: src/engines/README.md.
 */
import { ENGINE_NAMES as NAMES, type EngineName } from '../core/types.ts';
import type { EngineAdapter } from './adapter.ts';
import { namesText } from '../config/parsers.ts';
import { sglang } from './sglang/index.ts';
import { trtllm } from './trtllm/index.ts';
import { vllm } from './vllm/index.ts';

export type { EngineName } from '../core/types.ts';
export type { EngineAdapter, EngineEvents, EngineMetricNames } from './adapter.ts';

/** Keyed by every name of the union: a name without an adapter (or the reverse) does not compile. */
const ADAPTERS: Readonly<Record<EngineName, EngineAdapter>> = { vllm, sglang, trtllm };

/** Every engine, in the order docs and messages list them (the core's list; each has its adapter above). */
export const ENGINE_NAMES: readonly [EngineName, ...EngineName[]] = NAMES;

/** The engine a worker without `engine=` is. */
export const DEFAULT_ENGINE: EngineName = 'vllm';

export function isEngineName(v: unknown): v is EngineName {
  return typeof v === 'string' && Object.hasOwn(ADAPTERS, v);
}

export function engineAdapter(name: EngineName = DEFAULT_ENGINE): EngineAdapter {
  return ADAPTERS[name];
}

/** Every adapter, in ENGINE_NAMES order. */
export function engineAdapters(): readonly EngineAdapter[] {
  return ENGINE_NAMES.map((n) => ADAPTERS[n]);
}

/** "vllm, sglang or trtllm": the list as messages and help texts say it. */
export function engineNamesText(conjunction = 'or'): string {
  return namesText(ENGINE_NAMES, conjunction);
}
