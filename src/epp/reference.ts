/**
 * The reference endpoint picker's command line, as its Helm chart renders it, in kvroute's terms: so that pointing the
 * chart's image at kvroute is all a user changes. Flag names and meanings from llm-d/llm-d-router
 * pkg/epp/server/options.go and pkg/common/observability/logging/options.go @ebab6879; the arguments the charts pass
 * from config/charts/routerlib/templates/_deployment.yaml @ebab6879 (llm-d-router-gateway) and, before the picker moved
 * there, kubernetes-sigs/gateway-api-inference-extension config/charts/epplib/templates/_deployment.yaml @1748e829.
 *
 * A reference flag kvroute has a setting for becomes that setting's flag; one with no counterpart (tracing switches,
 * leader election, model-server metric names, ...) is dropped and named in one log line; none fails the start.
 */

export interface TranslatedArgs {
  /** The command line for commander: kvroute's own flags, untouched, and the translated ones. */
  readonly argv: string[];
  /** Reference flags dropped, as given (`--flag=value`). */
  readonly ignored: string[];
  /** What a translation means, for the log (`--ha-enable-leader-election: replicas run active-active ...`). */
  readonly notes: string[];
  /** --config-text: the plugin configuration given inline. */
  readonly configText?: string;
}

/** What kvroute's own command accepts: long and short option names, and whether each takes a value. */
export interface KnownOptions {
  takesValue(flag: string): boolean | undefined;
}

const BOOL_TRUE = new Set(['', 'true', '1', 't', 'yes']);
const BOOL_FALSE = new Set(['false', '0', 'f', 'no']);

/** Renamed one to one (the value passes unchanged). */
const RENAMED: Readonly<Record<string, string>> = {
  '--grpc-port': '--port',
  '--pool-name': '--k8s-pool',
  '--pool-namespace': '--k8s-namespace',
  '--pool-group': '--k8s-pool-group',
  '--endpoint-selector': '--k8s-selector',
};

/** Reference flags that take a value (so `--flag value` consumes the next word). */
const REFERENCE_VALUED = new Set([
  ...Object.keys(RENAMED),
  '--endpoint-target-ports',
  '--zap-encoder',
  '--zap-log-level',
  '--zap-stacktrace-level',
  '--zap-time-encoding',
  '--v',
  '-v',
  '--config-text',
  '--drain-timeout',
  '--refresh-metrics-interval',
  '--refresh-prometheus-metrics-interval',
  '--metrics-staleness-threshold',
  '--total-queued-requests-metric',
  '--total-running-requests-metric',
  '--kv-cache-usage-percentage-metric',
  '--lora-info-metric',
  '--cache-info-metric',
  '--model-server-metrics-path',
  '--grpc-max-recv-msg-size',
  '--grpc-max-send-msg-size',
  '--tls-min-version',
  '--tls-cipher-suites',
]);

/** Reference switches: `--flag`, `--flag=true|false`, never a separate value word. */
const REFERENCE_SWITCHES = new Set([
  '--secure-serving',
  '--metrics-endpoint-auth',
  '--enable-cert-reload',
  '--ha-enable-leader-election',
  '--tracing',
  '--health-checking',
  '--enable-pprof',
  '--zap-devel',
  '--disable-endpoint-subset-filter',
  '--emit-endpoint-scores',
  '--enable-grpc-stream-metrics',
  '--allow-experimental-plugins',
]);

/** The reference's verbosity (-v: 2 default, 3 verbose, 4 debug, 5 trace; logging/logging.go) as a kvroute level. */
function levelOfVerbosity(v: number): string {
  if (v >= 5) return 'trace';
  if (v >= 3) return 'debug';
  return 'info';
}

function levelOfZap(level: string): string | undefined {
  if (/^\d+$/.test(level)) return levelOfVerbosity(Number(level));
  return (
    { debug: 'debug', info: 'info', warn: 'warn', error: 'error', dpanic: 'fatal', panic: 'fatal', fatal: 'fatal' } as Record<
      string,
      string
    >
  )[level.toLowerCase()];
}

/**
 * Translates a command line (the words after `epp`). `env` is the process environment: the chart sets NAMESPACE, which
 * the reference picker takes as the pool's namespace when --pool-namespace is absent.
 */
export function translateReferenceArgs(
  words: readonly string[],
  known: KnownOptions,
  env: Readonly<Record<string, string | undefined>> = {},
): TranslatedArgs {
  const argv: string[] = [];
  const ignored: string[] = [];
  const notes = new Set<string>();
  let configText: string | undefined;
  let logLevel: string | undefined;
  let explicitLogLevel = false;
  let namespaceGiven = false;
  for (let i = 0; i < words.length; i++) {
    const word = words[i];
    if (!word.startsWith('-') || word === '-' || word === '--') {
      argv.push(word);
      continue;
    }
    const eq = word.indexOf('=');
    const name = eq > 0 ? word.slice(0, eq) : word;
    const inline = eq > 0 ? word.slice(eq + 1) : undefined;
    const ownValue = known.takesValue(name);
    const referenceName = name === '-v' ? '--v' : name;
    // kvroute's own flags first: they pass untouched (commander reads --flag value and --flag=value alike).
    if (ownValue !== undefined && !REFERENCE_SWITCHES.has(referenceName) && !RENAMED[referenceName]) {
      if (name === '--log-level') explicitLogLevel = true;
      if (name === '--k8s-namespace') namespaceGiven = true;
      argv.push(word);
      if (ownValue && inline === undefined && i + 1 < words.length) argv.push(words[++i]);
      continue;
    }
    const valued = REFERENCE_VALUED.has(referenceName);
    let value = inline;
    if (value === undefined && (valued || !REFERENCE_SWITCHES.has(referenceName))) {
      // An unknown flag followed by a word that is not a flag: that word is its value (`--some-flag value`).
      const next = words[i + 1];
      if (next !== undefined && (valued || !next.startsWith('-'))) value = words[++i];
    }
    const shown = value === undefined ? name : `${name}=${value}`;
    const bool = (v: string | undefined) => {
      const t = (v ?? '').toLowerCase();
      return BOOL_TRUE.has(t) ? true : BOOL_FALSE.has(t) ? false : undefined;
    };
    switch (referenceName) {
      case '--grpc-port':
      case '--pool-name':
      case '--pool-namespace':
      case '--pool-group':
      case '--endpoint-selector':
        if (referenceName === '--pool-namespace') namespaceGiven = true;
        argv.push(RENAMED[referenceName], value ?? '');
        break;
      case '--endpoint-target-ports':
        // Every port is an endpoint of every selected pod, as the pool's targetPorts are.
        argv.push('--k8s-port', value ?? '');
        break;
      case '--secure-serving': {
        const on = bool(value);
        if (on === false) argv.push('--no-secure-serving');
        else if (on === undefined) ignored.push(shown);
        break;
      }
      case '--metrics-endpoint-auth': {
        const on = bool(value);
        if (on === undefined) ignored.push(shown);
        else argv.push('--metrics-auth', on ? 'kubernetes' : 'none');
        break;
      }
      case '--enable-cert-reload':
        notes.add('--enable-cert-reload: kvroute always reloads the certificate files when they change');
        break;
      case '--zap-encoder':
        if (value !== 'json') notes.add(`--zap-encoder ${value}: kvroute logs JSON lines`);
        break;
      case '--v':
        if (value !== undefined && /^\d+$/.test(value)) logLevel = levelOfVerbosity(Number(value));
        else ignored.push(shown);
        break;
      case '--zap-log-level': {
        const level = levelOfZap(value ?? '');
        if (level) logLevel = level;
        else ignored.push(shown);
        break;
      }
      case '--config-text':
        configText = value;
        break;
      case '--ha-enable-leader-election':
        if (bool(value) !== false)
          notes.add('--ha-enable-leader-election: kvroute replicas all route (active-active), sharing state over --nats');
        break;
      default:
        ignored.push(shown);
    }
  }
  if (logLevel !== undefined && !explicitLogLevel) argv.push('--log-level', logLevel);
  const namespace = env.NAMESPACE;
  if (!namespaceGiven && namespace && !env.KVROUTE_K8S_NAMESPACE) argv.push('--k8s-namespace', namespace);
  return { argv, ignored, notes: [...notes], ...(configText !== undefined ? { configText } : {}) };
}

/** Flags only the reference picker has: a command line that starts with one of them is the picker's. */
const PICKER_FIRST = new Set([
  '--pool-name',
  '--pool-namespace',
  '--pool-group',
  '--endpoint-selector',
  '--endpoint-target-ports',
  '--grpc-port',
  '--grpc-health-port',
  '--config-file',
  '--config-text',
  '--zap-encoder',
  '--zap-log-level',
  '--secure-serving',
  '--cert-path',
  '--ha-enable-leader-election',
]);

/**
 * The reference picker's image runs its binary with flags alone (its Helm chart renders `args` and no `command`), so
 * kvroute's image, whose entrypoint is `kvroute`, gets `kvroute --pool-name ...`: such a command line is `kvroute epp`.
 */
export function startsAsPicker(words: readonly string[]): boolean {
  const first = words[0];
  return first !== undefined && PICKER_FIRST.has(first.split('=')[0]);
}
