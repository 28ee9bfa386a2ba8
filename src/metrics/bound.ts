/**
 * prom-client's observe() and inc() check and hash their labels object on every call (validateLabel, hashObject: a
 * string built per call), and its labels() children only bind the object, so they pay the same. On the request path
 * that is ~15 calls per request. `fastHistogram` / `fastCounter` give one metric a fast path for labels objects the
 * caller reuses (RouterMetrics keeps one `{ worker }` object per worker label; phases, APIs and outcomes have one each):
 * the first call with an object goes through prom-client as always and remembers the series prom-client stored;
 * the next calls with the same object add to that series directly, exactly as prom-client's own code does.
 *
 * Anything else (a new object, a non-finite or negative value, a series prom-client has since replaced by reset() or
 * zero()) takes prom-client's own path, so its checks and errors are unchanged. This reads prom-client's internal
 * series table (hashMap, sortedLabelNames, upperBounds) of the pinned version; test/metrics/bound.test.ts compares the
 * exposition text of both paths, so a prom-client whose internals moved fails there, not in production.
 */
import type { Counter, Histogram, LabelValues } from 'prom-client';

interface HistogramSeries {
  sum: number;
  count: number;
  bucketValues: Record<number, number>;
}

interface CounterSeries {
  value: number;
}

interface Internals<S> {
  hashMap: Record<string, S>;
  sortedLabelNames: readonly string[];
  upperBounds: readonly number[];
}

interface Slot<S> {
  key: string;
  series: S;
}

/** prom-client's own series key (util.js fastHashObject) for these labels. */
function seriesKey(names: readonly string[], labels: Record<string, unknown>): string {
  let key = '';
  for (const name of names) {
    const v = labels[name];
    if (v !== undefined) key += `${name}:${v},`;
  }
  return key;
}

function slotOf<S>(m: Internals<S>, labels: Record<string, unknown>): Slot<S> | undefined {
  const key = seriesKey(m.sortedLabelNames, labels);
  const series = m.hashMap[key];
  return series === undefined ? undefined : { key, series };
}

/** After prom-client's own path stored a series for `labels`: remember it for the fast path of the next calls. */
function remember<S>(slots: WeakMap<object, Slot<S>>, m: Internals<S>, labels: object): void {
  const fresh = slotOf(m, labels as Record<string, unknown>);
  if (fresh) slots.set(labels, fresh);
}

/** Gives `h.observe(labels, value)` the fast path for reused labels objects; returns `h`. */
export function fastHistogram<T extends string>(h: Histogram<T>): Histogram<T> {
  const m = h as unknown as Internals<HistogramSeries>;
  const slow = h.observe.bind(h) as (labels: LabelValues<T> | number, value?: number) => void;
  const slots = new WeakMap<object, Slot<HistogramSeries>>();
  const has = Object.prototype.hasOwnProperty;
  // The buckets' property keys, made once: a bound used as a key is turned into its string on every access otherwise
  // (prom-client's own path does that; the series are the same either way).
  const bounds = m.upperBounds;
  const keys = bounds.map(String);
  h.observe = ((labels: LabelValues<T> | number, value?: number): void => {
    if (typeof labels === 'object' && labels !== null && typeof value === 'number' && Number.isFinite(value)) {
      const slot = slots.get(labels);
      if (slot !== undefined && m.hashMap[slot.key] === slot.series && m.upperBounds === bounds) {
        const s = slot.series;
        s.sum += value;
        s.count += 1;
        for (let i = 0; i < bounds.length; i++) {
          if (value <= bounds[i]) {
            const k = keys[i];
            if (has.call(s.bucketValues, k)) s.bucketValues[k as unknown as number] += 1;
            break;
          }
        }
        return;
      }
      slow(labels, value);
      remember(slots, m, labels);
      return;
    }
    slow(labels, value);
  }) as Histogram<T>['observe'];
  return h;
}

/** Gives `c.inc(labels, value)` the fast path for reused labels objects; returns `c`. */
export function fastCounter<T extends string>(c: Counter<T>): Counter<T> {
  const m = c as unknown as Internals<CounterSeries>;
  const slow = c.inc.bind(c) as (labels?: LabelValues<T> | number, value?: number) => void;
  const slots = new WeakMap<object, Slot<CounterSeries>>();
  c.inc = ((labels?: LabelValues<T> | number, value?: number): void => {
    if (typeof labels === 'object' && labels !== null) {
      const v = value ?? 1;
      if (typeof v === 'number' && Number.isFinite(v) && v >= 0) {
        const slot = slots.get(labels);
        if (slot !== undefined && m.hashMap[slot.key] === slot.series) {
          slot.series.value += v;
          return;
        }
        slow(labels, value);
        remember(slots, m, labels);
        return;
      }
    }
    slow(labels, value);
  }) as Counter<T>['inc'];
  return c;
}

/** One labels object per value of a single label: stable objects for the fast paths. */
export function labelObjects<K extends string>(name: K): (value: string) => Readonly<Record<K, string>> {
  const objects = new Map<string, Readonly<Record<K, string>>>();
  return (value) => {
    let o = objects.get(value);
    if (o === undefined) {
      o = { [name]: value } as Record<K, string>;
      objects.set(value, o);
    }
    return o;
  };
}

/**
 * The `worker` label values of one registry, bounded: the first `max` workers get their own, the rest share `_other`.
 * `onNew` runs once per new label with its labels object (its series exist at 0 from then on, so rate() sees the first
 * request instead of a new series). The labels objects are the reused ones the fast path above finds its series by.
 */
export class WorkerLabels {
  private readonly seen = new Set<string>();
  private readonly objects = labelObjects('worker');

  constructor(
    private readonly max: number,
    private readonly onNew: (labels: { worker: string }) => void,
  ) {}

  label(sourceKey: string): string {
    if (this.seen.has(sourceKey)) return sourceKey;
    const label = this.seen.size < this.max ? sourceKey : '_other';
    if (!this.seen.has(label)) {
      this.seen.add(label);
      this.onNew(this.objects(label));
    }
    return label;
  }

  of(sourceKey: string): { worker: string } {
    return this.objects(this.label(sourceKey));
  }
}
