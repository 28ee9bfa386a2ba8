/**
 * A tiny msgpack writer for test fixtures, independent of msgpackr, writing what Python's msgpack/msgspec write:
 * the smallest int format (positive ints as unsigned), float64 for floats, str8+ for strings.
 */
export type HandValue = null | boolean | number | bigint | string | Uint8Array | HandValue[] | { [k: string]: HandValue };

export function hand(v: HandValue): Buffer {
  const out: number[] = [];
  const be = (n: bigint, bytes: number) => {
    for (let i = bytes - 1; i >= 0; i--) out.push(Number((n >> BigInt(8 * i)) & 0xffn));
  };
  const int = (n: bigint) => {
    if (n >= 0n) {
      if (n < 128n) out.push(Number(n));
      else if (n < 256n) out.push(0xcc, Number(n));
      else if (n < 65536n) out.push(0xcd), be(n, 2);
      else if (n < 1n << 32n) out.push(0xce), be(n, 4);
      else out.push(0xcf), be(n, 8);
    } else {
      if (n >= -32n) out.push(Number(n & 0xffn));
      else if (n >= -128n) out.push(0xd0), be(n & 0xffn, 1);
      else if (n >= -32768n) out.push(0xd1), be(n & 0xffffn, 2);
      else if (n >= -(1n << 31n)) out.push(0xd2), be(n & 0xffffffffn, 4);
      else out.push(0xd3), be(BigInt.asUintN(64, n), 8);
    }
  };
  const w = (x: HandValue): void => {
    if (x === null) out.push(0xc0);
    else if (typeof x === 'boolean') out.push(x ? 0xc3 : 0xc2);
    else if (typeof x === 'bigint') int(x);
    else if (typeof x === 'number') {
      if (Number.isInteger(x)) int(BigInt(x));
      else {
        const b = Buffer.alloc(8);
        b.writeDoubleBE(x);
        out.push(0xcb, ...b);
      }
    } else if (typeof x === 'string') {
      const b = Buffer.from(x, 'utf8');
      if (b.length < 32) out.push(0xa0 | b.length);
      else if (b.length < 256) out.push(0xd9, b.length);
      else out.push(0xda), be(BigInt(b.length), 2);
      out.push(...b);
    } else if (x instanceof Uint8Array) {
      out.push(0xc4, x.length, ...x);
    } else if (Array.isArray(x)) {
      if (x.length < 16) out.push(0x90 | x.length);
      else out.push(0xdc), be(BigInt(x.length), 2);
      x.forEach(w);
    } else {
      const keys = Object.keys(x);
      if (keys.length < 16) out.push(0x80 | keys.length);
      else out.push(0xde), be(BigInt(keys.length), 2);
      for (const k of keys) {
        w(k);
        w(x[k]);
      }
    }
  };
  w(v);
  return Buffer.from(out);
}

/** The real event of docs/protocols.md §2 (vLLM 0.26, Qwen3-8B, volcano-sh/kthena#1535). */
export const KTHENA_TOKENS = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667];
export const KTHENA_HASH = 15760518052499183552n;
export const KTHENA_BATCH: HandValue = [
  1789095808.83,
  [
    {
      type: 'BlockStored',
      block_hashes: [KTHENA_HASH],
      parent_block_hash: null,
      token_ids: KTHENA_TOKENS,
      block_size: 16,
      lora_id: null,
      medium: 'GPU',
      lora_name: null,
      extra_keys: [null],
      group_idx: 0,
      kv_cache_spec_kind: 'full_attention',
    },
  ],
  0,
];
