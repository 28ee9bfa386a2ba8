import type { Command } from 'commander';
import { addServeOptions, serveSettingsFrom } from '../config/serve.ts';
import { FLAGS_ONLY } from '../config/settings.ts';
import { computeBlockHashes, hashSeed } from '../core/hashing.ts';

/** Parses a JSON array of token ids; returns an error message instead of throwing. */
export function parseTokenArray(text: string): number[] | string {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return `stdin is not valid JSON (${(err as Error).message}); expected an array of token ids like [1, 2, 3]`;
  }
  if (!Array.isArray(value)) return 'expected a JSON array of token ids like [1, 2, 3]';
  for (let i = 0; i < value.length; i++) {
    const t = value[i];
    if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t > 0xffffffff) {
      return `token at index ${i} is ${JSON.stringify(t)}: token ids must be integers in [0, 4294967295]`;
    }
  }
  return value as number[];
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export function registerHash(program: Command): void {
  const hash = program
    .command('hash')
    .summary("print kvroute's block hashes for token ids read on stdin")
    .description(
      "Print kvroute's block hashes for a JSON array of token ids read on stdin, to check hash parity with other " +
        'systems (NVIDIA Dynamo uses the same scheme). Only full blocks are hashed; a trailing partial block is not. ' +
        'Output: {"local": [...], "seq": [...]} with hashes as unsigned decimal strings.',
    )
    .option('--lora <name>', 'LoRA adapter name mixed into the seed (as vLLM lora_name)')
    .option('--salt <salt>', 'cache_salt mixed into the seed (per-tenant isolation)');
  // The block size as serve declares it, required here: a parity check must name the engine's.
  addServeOptions(hash, ['blockSize'], { ...FLAGS_ONLY, group: false, required: ['blockSize'] });
  hash
    .addHelpText('after', '\nExample:\n  echo "[151644, 872, 198, 4340]" | kvroute hash --block-size 4')
    .action(async (opts: { lora?: string; salt?: string }, cmd: Command) => {
      const { blockSize } = serveSettingsFrom(cmd, ['blockSize']);
      const tokens = parseTokenArray(await readStdin());
      if (typeof tokens === 'string') {
        process.stderr.write(`kvroute hash: ${tokens}\n`);
        process.exitCode = 2;
        return;
      }
      const h = computeBlockHashes(tokens, blockSize, hashSeed(opts.lora, opts.salt));
      const dec = (xs: BigUint64Array) => Array.from(xs, (x) => x.toString());
      process.stdout.write(`${JSON.stringify({ local: dec(h.local), seq: dec(h.seq) })}\n`);
    });
}
