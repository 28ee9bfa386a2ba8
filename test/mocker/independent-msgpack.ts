/**
 * A deliberately independent msgpack decoder for the mocker tests, written from the msgpack spec (and
 * docs/protocols.md §2) and sharing no code with src/engines/vllm.ts or msgpackr. 64-bit integers always come back as bigint
 * (uint64 unsigned, int64 signed) so the wire type is visible; other integers as number; bin as Uint8Array.
 */
export type Msg = null | boolean | number | bigint | string | Uint8Array | Msg[] | Map<string | number, Msg>;

export function decodeMsgpack(buf: Uint8Array): Msg {
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let pos = 0;
  const text = new TextDecoder('utf-8', { fatal: true });

  const u8 = () => view.getUint8(pos++);
  const u16 = () => {
    const v = view.getUint16(pos);
    pos += 2;
    return v;
  };
  const u32 = () => {
    const v = view.getUint32(pos);
    pos += 4;
    return v;
  };
  const bytes = (n: number) => {
    if (pos + n > buf.length) throw new Error('truncated');
    const b = buf.subarray(pos, pos + n);
    pos += n;
    return b;
  };
  const str = (n: number) => text.decode(bytes(n));
  const arr = (n: number): Msg[] => {
    const out: Msg[] = [];
    for (let i = 0; i < n; i++) out.push(item());
    return out;
  };
  const map = (n: number): Map<string | number, Msg> => {
    const out = new Map<string | number, Msg>();
    for (let i = 0; i < n; i++) {
      const k = item();
      if (typeof k !== 'string' && typeof k !== 'number') throw new Error(`unsupported map key ${typeof k}`);
      out.set(k, item());
    }
    return out;
  };

  function item(): Msg {
    const b = u8();
    if (b <= 0x7f) return b;
    if (b >= 0xe0) return b - 0x100;
    if ((b & 0xf0) === 0x80) return map(b & 0x0f);
    if ((b & 0xf0) === 0x90) return arr(b & 0x0f);
    if ((b & 0xe0) === 0xa0) return str(b & 0x1f);
    switch (b) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        return bytes(u8()).slice();
      case 0xc5:
        return bytes(u16()).slice();
      case 0xc6:
        return bytes(u32()).slice();
      case 0xca: {
        const v = view.getFloat32(pos);
        pos += 4;
        return v;
      }
      case 0xcb: {
        const v = view.getFloat64(pos);
        pos += 8;
        return v;
      }
      case 0xcc:
        return u8();
      case 0xcd:
        return u16();
      case 0xce:
        return u32();
      case 0xcf: {
        const v = view.getBigUint64(pos);
        pos += 8;
        return v;
      }
      case 0xd0: {
        const v = view.getInt8(pos);
        pos += 1;
        return v;
      }
      case 0xd1: {
        const v = view.getInt16(pos);
        pos += 2;
        return v;
      }
      case 0xd2: {
        const v = view.getInt32(pos);
        pos += 4;
        return v;
      }
      case 0xd3: {
        const v = view.getBigInt64(pos);
        pos += 8;
        return v;
      }
      case 0xd9:
        return str(u8());
      case 0xda:
        return str(u16());
      case 0xdb:
        return str(u32());
      case 0xdc:
        return arr(u16());
      case 0xdd:
        return arr(u32());
      case 0xde:
        return map(u16());
      case 0xdf:
        return map(u32());
      default:
        throw new Error(`unsupported msgpack type byte 0x${b.toString(16)} at ${pos - 1}`);
    }
  }

  const v = item();
  if (pos !== buf.length) throw new Error(`${buf.length - pos} trailing bytes`);
  return v;
}

/** An integer from the wire as bigint, whatever width msgpack chose. */
export function asBig(v: Msg): bigint {
  if (typeof v === 'bigint') return v;
  if (typeof v === 'number' && Number.isInteger(v)) return BigInt(v);
  throw new Error(`not an integer: ${String(v)}`);
}
