/**
 * The instruction count of one callgrind dump, split into V8's garbage collector, its optimizing compilers and the rest
 * (callgrind_annotate's self costs by function name). A major GC or an optimizing compile lands in a counted window or
 * not, so "the rest" is the figure to compare between builds and runs. Used by bench:callgrind and bench:mrc.
 */
import { execFileSync } from 'node:child_process';

export interface Counts {
  total: number;
  gc: number;
  jit: number;
}

const GC_FN =
  /v8::internal::(\w*(Mark|Sweep|Scaveng|Evacuat|Compact|Visitor|Heap|MemoryChunk|RememberedSet|FreeList|PagedSpace|NewSpace|SemiSpace|Pretenuring|GlobalHandles|WeakObjects|StringTableCleaner))|heap::base::|IterateObjectCache|std::__detail::_Map_base<v8::internal::MemoryChunk/;
const JIT_FN =
  /v8::internal::(compiler|maglev|turboshaft|baseline|wasm)::|v8::internal::(Pipeline|OptimizedCompilationJob|TranslationArrayBuilder|Deoptimizer|Zone\b|SourcePositionTable|RelocIterator)/;

export function countsOf(file: string): Counts {
  const out = execFileSync('callgrind_annotate', ['--inclusive=no', '--threshold=100', file], { maxBuffer: 256 * 1024 * 1024 }).toString();
  const total = /^\s*([\d,]+) +\(100\.0%\) +PROGRAM TOTALS/m.exec(out);
  if (!total) throw new Error(`no totals in ${file}`);
  const c: Counts = { total: Number(total[1].replaceAll(',', '')), gc: 0, jit: 0 };
  for (const line of out.split('\n')) {
    const m = /^\s*([\d,]+) +\(\s*[\d.]+%\) +(.*)$/.exec(line);
    if (!m || m[2].startsWith('PROGRAM TOTALS')) continue;
    const n = Number(m[1].replaceAll(',', ''));
    if (GC_FN.test(m[2])) c.gc += n;
    else if (JIT_FN.test(m[2])) c.jit += n;
  }
  return c;
}
