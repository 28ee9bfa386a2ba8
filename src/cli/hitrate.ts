import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { type Command, InvalidArgumentError } from 'commander';
import type { MrcReport } from '../core/mrc.ts';
import { durationArg } from '../config/parsers.ts';
import { buildReport, formatReport, reportJson, ScrapeError } from '../metrics/hitrate-report.ts';
import { metricsUrl } from '../metrics/scrape.ts';
import { formatWhatIf } from '../metrics/what-if.ts';

/** --window: "60s", "2m", "500ms", "1h" or a bare number of seconds -> seconds. */
export const parseDuration = durationArg('--window');

/** `name=URL` or a bare URL (named by its host:port). */
export function parseEngineArg(arg: string): { name: string; url: string } {
  const eq = arg.indexOf('=');
  if (eq > 0 && !arg.slice(0, eq).includes('/') && !arg.slice(0, eq).includes(':')) {
    return { name: arg.slice(0, eq), url: arg.slice(eq + 1) };
  }
  let name = arg;
  try {
    name = new URL(arg).host;
  } catch {
    /* keep the raw text as the name; fetch will report the bad URL */
  }
  return { name, url: arg };
}

async function scrape(url: string, timeoutMs = 10_000): Promise<string> {
  const target = metricsUrl(url);
  let res: Response;
  try {
    res = await fetch(target, { signal: AbortSignal.timeout(timeoutMs) });
  } catch (err) {
    throw new Error(`cannot scrape ${target}: ${(err as Error).cause ?? (err as Error).message}`);
  }
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`cannot scrape ${target}: HTTP ${res.status}`);
  }
  return res.text();
}

interface HitrateOptions {
  router?: string;
  window: number;
  engine: string[];
  json?: boolean;
  from?: string;
  to?: string;
  prefix?: string;
  whatIf?: boolean;
  hostBlocks?: number;
  adminToken?: string;
}

/** --host-blocks: an integer >= 0. */
function hostBlocksArg(v: string): number {
  const n = Number(v);
  if (v.trim() === '' || !Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`--host-blocks must be an integer >= 0, got "${v}"`);
  return n;
}

async function whatIf(opts: HitrateOptions): Promise<MrcReport> {
  const base = opts.router!.replace(/\/+$/, '');
  const target = `${base}/debug/mrc${opts.hostBlocks !== undefined ? `?host_blocks=${opts.hostBlocks}` : ''}`;
  const token = opts.adminToken ?? process.env.KVROUTE_ADMIN_TOKEN;
  let res: Response;
  try {
    res = await fetch(target, { signal: AbortSignal.timeout(10_000), headers: token ? { authorization: `Bearer ${token}` } : {} });
  } catch (err) {
    throw new Error(`cannot read ${target}: ${(err as Error).cause ?? (err as Error).message}`);
  }
  const body = await res.text();
  if (!res.ok) {
    let message = body.slice(0, 300);
    try {
      message = (JSON.parse(body) as { error?: { message?: string } }).error?.message ?? message;
    } catch {
      /* not JSON: the raw text */
    }
    throw new Error(`${target}: HTTP ${res.status}: ${message}`);
  }
  return JSON.parse(body) as MrcReport;
}

export function registerHitrate(program: Command): void {
  program
    .command('hitrate')
    .summary("compare the router's predicted hit rate with the engines' (both aggregations, over a window)")
    .description(
      "Scrape the router's /metrics twice over a window (or read two saved scrapes) and print, overall and per worker: " +
        'predicted hit rate request-weighted (mean of ratios, what the histogram shows) and block-weighted (ratio of ' +
        "sums), reuse available in the fleet, reuse delivered (engine usage reports), the engines' own counters " +
        '(hits/queries), the gaps between them, and a one-line verdict.',
    )
    .option('--router <url>', 'router base URL (its /metrics is scraped)')
    .option('--window <duration>', 'time between the two scrapes (e.g. 60s, 2m)', parseDuration, 60)
    .option(
      '--engine <url...>',
      'also scrape engines directly ([name=]URL; name matches the worker label), when the router does not mirror them',
      [],
    )
    .option('--from <file>', 'offline: first saved scrape of the router /metrics')
    .option('--to <file>', 'offline: second saved scrape')
    .option('--prefix <prefix>', 'metric name prefix (detected from the scrape when omitted)')
    .option('--json', 'print the report as JSON (no data -> null, never 0)')
    .option(
      '--what-if',
      "what more KV capacity, a host tier or bigger engines would buy, from the router's live miss-ratio curves " +
        '(GET /debug/mrc; docs/cache-sizing.md); needs --router, no window',
    )
    .option('--host-blocks <n>', '--what-if: also answer for a host (CPU offload) tier of this many blocks per engine', hostBlocksArg)
    .option('--admin-token <token>', "--what-if: the router's admin token when API keys protect it (or KVROUTE_ADMIN_TOKEN)")
    .addHelpText(
      'after',
      '\nExamples:\n  kvroute hitrate --router http://localhost:8000 --window 60s\n' +
        '  curl -s localhost:8000/metrics > a.prom; sleep 300; curl -s localhost:8000/metrics > b.prom\n' +
        '  kvroute hitrate --from a.prom --to b.prom\n' +
        '  kvroute hitrate --router http://localhost:8000 --what-if --host-blocks 65536',
    )
    .action(async (opts: HitrateOptions) => {
      const fail = (msg: string, code = 1) => {
        process.stderr.write(`kvroute hitrate: ${msg}\n`);
        process.exitCode = code;
      };
      const offline = opts.from !== undefined || opts.to !== undefined;
      if (opts.whatIf) {
        if (!opts.router || offline) return fail('--what-if reads a live router: give --router URL (not --from/--to)', 2);
        try {
          const report = await whatIf(opts);
          process.stdout.write(opts.json ? `${JSON.stringify(report, null, 2)}\n` : formatWhatIf(report));
        } catch (err) {
          return fail((err as Error).message, 1);
        }
        return;
      }
      if (opts.hostBlocks !== undefined) return fail('--host-blocks goes with --what-if', 2);
      if (offline && (opts.from === undefined || opts.to === undefined)) return fail('--from and --to go together', 2);
      if (offline && opts.router) return fail('use either --router (live) or --from/--to (offline), not both', 2);
      if (!offline && !opts.router) return fail('--router URL is required (or --from A.prom --to B.prom)', 2);
      if (offline && opts.engine.length > 0) return fail('--engine needs a live --router', 2);

      let from: string;
      let to: string;
      let windowS = opts.window;
      let engines: { name: string; from: string; to: string }[] = [];
      try {
        if (offline) {
          [from, to] = await Promise.all([readFile(opts.from!, 'utf8'), readFile(opts.to!, 'utf8')]);
          windowS = NaN; // unknown for saved files
        } else {
          const targets = opts.engine.map(parseEngineArg);
          const first = await Promise.all([scrape(opts.router!), ...targets.map((t) => scrape(t.url))]);
          const t0 = performance.now();
          if (!opts.json) process.stderr.write(`scraped; scraping again in ${opts.window} s...\n`);
          await sleep(opts.window * 1000);
          const second = await Promise.all([scrape(opts.router!), ...targets.map((t) => scrape(t.url))]);
          windowS = (performance.now() - t0) / 1000;
          from = first[0];
          to = second[0];
          engines = targets.map((t, i) => ({ name: t.name, from: first[i + 1], to: second[i + 1] }));
        }
        const report = buildReport({ from, to, windowS, engines, prefix: opts.prefix });
        process.stdout.write(opts.json ? `${reportJson(report)}\n` : formatReport(report));
      } catch (err) {
        return fail((err as Error).message, err instanceof ScrapeError ? 2 : 1);
      }
    });
}
