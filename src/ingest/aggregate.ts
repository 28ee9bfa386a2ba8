/**
 * Engine blocks smaller than the router's (a divisor of it), joined into router blocks. Pure (no I/O).
 *
 * SGLang's default page size is 1: one BlockStored per token, each chained to the previous one. The router hashes full
 * router blocks, so `k = routerBlockSize / engineBlockSize` consecutive engine blocks of a chain make one router block,
 * announced to the index under the engine id of its last engine block (its "representative"), chained to the
 * representative of the router block before it.
 *
 * Each live engine block is remembered with its position inside its router block and the tokens of that router block
 * so far (shared by the blocks of one chain; a branch inside a router block copies the prefix it shares). Memory is
 * therefore one small entry per cached engine block (per cached token at page size 1), released by BlockRemoved.
 * Removing a representative removes its router block; removing an earlier block of a complete router block (which an
 * engine evicting leaves first never does) removes the router block too, so the index never claims a broken prefix.
 */
import type { EngineBlockId, StoredEvent } from '../core/types.ts';

interface Group {
  /** Tokens of this router block so far (up to k * engine block size). */
  tokens: number[];
  /** Representative of the router block before this one, null at the start of a sequence. */
  readonly prevRep: EngineBlockId | null;
  /** Set once the router block is complete (its last engine block); cleared when it is removed. */
  rep: EngineBlockId | null;
  readonly loraName: string | null;
  readonly cacheSalt: string | null;
}

interface Member {
  readonly group: Group;
  /** Position of this engine block inside its router block, 0..k-1. */
  readonly pos: number;
}

export interface AggregatorCounters {
  /** Engine blocks whose parent was never seen (or was dropped): they cannot be placed in a router block. */
  orphanBlocks: number;
  /** Router blocks completed and announced. */
  routerBlocks: number;
}

export class BlockAggregator {
  private readonly members = new Map<EngineBlockId, Member>();
  readonly counters: AggregatorCounters = { orphanBlocks: 0, routerBlocks: 0 };

  constructor(
    readonly engineBlockSize: number,
    readonly routerBlockSize: number,
  ) {
    if (!(routerBlockSize % engineBlockSize === 0 && routerBlockSize > engineBlockSize)) {
      throw new RangeError(`engine block ${engineBlockSize} does not divide router block ${routerBlockSize}`);
    }
  }

  get k(): number {
    return this.routerBlockSize / this.engineBlockSize;
  }

  /** Engine blocks currently remembered. */
  get size(): number {
    return this.members.size;
  }

  reset(): void {
    this.members.clear();
  }

  /** A Stored event of engine blocks (GPU, block size = engineBlockSize): the router blocks it completes. */
  stored(ev: StoredEvent): StoredEvent[] {
    const out: StoredEvent[] = [];
    const ebs = this.engineBlockSize;
    const k = this.k;
    const tokens = ev.tokens;
    if (!tokens || tokens.length !== ev.engineIds.length * ebs) {
      this.counters.orphanBlocks += ev.engineIds.length;
      return out;
    }
    let parent = ev.parent;
    for (let j = 0; j < ev.engineIds.length; j++) {
      const id = ev.engineIds[j];
      let group: Group;
      let pos: number;
      if (parent === null) {
        group = { tokens: [], prevRep: null, rep: null, loraName: ev.loraName ?? null, cacheSalt: ev.cacheSalt ?? null };
        pos = 0;
      } else {
        const p = this.members.get(parent);
        if (!p) {
          // The rest of the event hangs off this block: none of it can be placed.
          this.counters.orphanBlocks += ev.engineIds.length - j;
          return out;
        }
        if (p.pos === k - 1) {
          if (p.group.rep === null) {
            this.counters.orphanBlocks += ev.engineIds.length - j;
            return out;
          }
          group = { tokens: [], prevRep: p.group.rep, rep: null, loraName: p.group.loraName, cacheSalt: p.group.cacheSalt };
          pos = 0;
        } else {
          pos = p.pos + 1;
          const upTo = pos * ebs;
          if (p.group.tokens.length === upTo) {
            group = p.group; // extending the chain's tail: share
          } else {
            // A branch inside a router block: copy the shared prefix.
            const g = p.group;
            group = { tokens: g.tokens.slice(0, upTo), prevRep: g.prevRep, rep: null, loraName: g.loraName, cacheSalt: g.cacheSalt };
          }
        }
      }
      for (let t = j * ebs; t < (j + 1) * ebs; t++) group.tokens.push(tokens[t]);
      this.members.set(id, { group, pos });
      if (pos === k - 1) {
        group.rep = id;
        this.counters.routerBlocks++;
        const e: StoredEvent = {
          kind: 'stored',
          parent: group.prevRep,
          engineIds: [id],
          tokens: group.tokens,
          blockSize: this.routerBlockSize,
          loraName: group.loraName,
          cacheSalt: group.cacheSalt,
          groupIdx: ev.groupIdx ?? 0,
        };
        out.push(ev.medium !== undefined ? { ...e, medium: ev.medium } : e);
      }
      parent = id;
    }
    return out;
  }

  /** Engine blocks removed: the router blocks (by representative) that are no longer whole. */
  removed(ids: readonly EngineBlockId[]): EngineBlockId[] {
    const gone: EngineBlockId[] = [];
    for (const id of ids) {
      const m = this.members.get(id);
      if (!m) continue;
      this.members.delete(id);
      const rep = m.group.rep;
      if (rep !== null && m.group.tokens.length === this.routerBlockSize) {
        // Only a complete router block was announced; it goes with any of its engine blocks.
        m.group.rep = null;
        gone.push(rep);
      }
    }
    return gone;
  }

  /** Test helper: whether an engine id is remembered. */
  has(id: EngineBlockId): boolean {
    return this.members.has(id);
  }
}

/** Whether `engine` blocks can be joined into `router` blocks. */
export function aggregatable(engine: number, router: number): boolean {
  return Number.isInteger(engine) && engine > 0 && engine < router && router % engine === 0;
}
