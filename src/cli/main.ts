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

// Commands are registered here, one line each.
registerHash(program);
(await import('./hitrate.ts')).registerHitrate(program);
(await import('./mocker.ts')).registerMocker(program);
(await import('./sim.ts')).registerSim(program);
(await import('./trace.ts')).registerTrace(program);
(await import('./serve.ts')).registerServe(program);
(await import('./relay.ts')).registerRelay(program);
(await import('./epp.ts')).registerEpp(program);

const commandLabel = () => `kvroute${program.args[0] ? ` ${program.args[0]}` : ''}`;
const settled = guardStartup(commandLabel);
try {
  // The reference endpoint picker's Helm chart runs the image with the picker's flags and no command: that is `epp`.
  const { startsAsPicker } = await import('../epp/reference.ts');
  const words = process.argv.slice(2);
  await program.parseAsync(startsAsPicker(words) ? [...process.argv.slice(0, 2), 'epp', ...words] : process.argv);
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
