/**
 * `kvroute` command line. Each subcommand lives in its own file and registers itself here.
 */
import { Command } from 'commander';
import { registerHash } from './hash.ts';
import { guardStartup } from './startup-guard.ts';

const program = new Command();
program
  .name('kvroute')
  .description(
    'KV-cache-aware router for LLM inference fleets (vLLM, SGLang): learns what every engine has cached from its ' +
      'KV events, routes each request to the engine that already holds its prefix, and reports its hit rate honestly.',
  )
  .version('0.1.0')
  .showHelpAfterError('(run with --help for usage)');

// Commands are registered here, one line each, each module loaded only when needed: a process that runs one
// subcommand (most launches) loads that subcommand's modules, not every other's (`kvroute serve --bogus`: 1.05 s of
// wall time with every module, 0.41 s with serve's alone and its server loaded by the action). `kvroute --help` and a mistyped command register them all.
const COMMANDS: Record<string, (p: Command) => Promise<void>> = {
  hash: async (p) => registerHash(p),
  hitrate: async (p) => (await import('./hitrate.ts')).registerHitrate(p),
  mocker: async (p) => (await import('./mocker.ts')).registerMocker(p),
  sim: async (p) => (await import('./sim.ts')).registerSim(p),
  trace: async (p) => (await import('./trace.ts')).registerTrace(p),
  serve: async (p) => (await import('./serve.ts')).registerServe(p),
  relay: async (p) => (await import('./relay.ts')).registerRelay(p),
  epp: async (p) => (await import('./epp.ts')).registerEpp(p),
};

const commandLabel = () => `kvroute${program.args[0] ? ` ${program.args[0]}` : ''}`;
const settled = guardStartup(commandLabel);
try {
  // The reference endpoint picker's Helm chart runs the image with the picker's flags and no command: that is `epp`.
  const { startsAsPicker } = await import('../epp/reference.ts');
  const words = process.argv.slice(2);
  const argv = startsAsPicker(words) ? [...process.argv.slice(0, 2), 'epp', ...words] : process.argv;
  const only = COMMANDS[argv[2]];
  if (only) await only(program);
  else for (const register of Object.values(COMMANDS)) await register(program);
  await program.parseAsync(argv);
  settled();
} catch (err) {
  settled();
  // A bad setting or an unusable resource at startup: say what is wrong in one line, not a stack trace,
  // prefixed with the (sub)command that refused it ("kvroute trace gen: ...").
  const path: string[] = [];
  let command: Command = program;
  for (const arg of program.args) {
    const sub = command.commands.find((c) => c.name() === arg || c.aliases().includes(arg));
    if (!sub) break;
    path.push(arg);
    command = sub;
  }
  process.stderr.write(`${['kvroute', ...path].join(' ')}: ${(err as Error).message}\n`);
  if (process.env.KVROUTE_DEBUG) process.stderr.write(`${(err as Error).stack}\n`);
  process.exit(2);
}
