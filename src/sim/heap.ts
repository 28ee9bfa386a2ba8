/**
 * Min-heap of simulation events keyed by (time, insertion order): equal times pop in the order they were pushed,
 * which keeps a run deterministic. Parallel typed arrays, no per-event objects.
 */
export class EventHeap {
  private time = new Float64Array(1024);
  private order = new Float64Array(1024);
  private kind = new Int32Array(1024);
  private arg = new Int32Array(1024);
  private n = 0;
  private pushed = 0;

  get size(): number {
    return this.n;
  }

  push(time: number, kind: number, arg: number): void {
    if (this.n === this.time.length) this.grow();
    let i = this.n++;
    const seq = this.pushed++;
    // Sift up.
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this.time[p] < time || (this.time[p] === time && this.order[p] < seq)) break;
      this.move(p, i);
      i = p;
    }
    this.time[i] = time;
    this.order[i] = seq;
    this.kind[i] = kind;
    this.arg[i] = arg;
  }

  peekTime(): number {
    return this.n > 0 ? this.time[0] : Infinity;
  }

  /** Pops the earliest event into `out` (time, kind, arg). Returns false when empty. */
  pop(out: { time: number; kind: number; arg: number }): boolean {
    if (this.n === 0) return false;
    out.time = this.time[0];
    out.kind = this.kind[0];
    out.arg = this.arg[0];
    const last = --this.n;
    if (last === 0) return true;
    const t = this.time[last];
    const s = this.order[last];
    const k = this.kind[last];
    const a = this.arg[last];
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= last) break;
      if (c + 1 < last && (this.time[c + 1] < this.time[c] || (this.time[c + 1] === this.time[c] && this.order[c + 1] < this.order[c])))
        c++;
      if (t < this.time[c] || (t === this.time[c] && s < this.order[c])) break;
      this.move(c, i);
      i = c;
    }
    this.time[i] = t;
    this.order[i] = s;
    this.kind[i] = k;
    this.arg[i] = a;
    return true;
  }

  private move(from: number, to: number): void {
    this.time[to] = this.time[from];
    this.order[to] = this.order[from];
    this.kind[to] = this.kind[from];
    this.arg[to] = this.arg[from];
  }

  private grow(): void {
    const cap = this.time.length * 2;
    const t = new Float64Array(cap);
    t.set(this.time);
    this.time = t;
    const o = new Float64Array(cap);
    o.set(this.order);
    this.order = o;
    const k = new Int32Array(cap);
    k.set(this.kind);
    this.kind = k;
    const a = new Int32Array(cap);
    a.set(this.arg);
    this.arg = a;
  }
}
