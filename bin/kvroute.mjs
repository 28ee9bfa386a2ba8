#!/usr/bin/env node
// Runs the compiled CLI in dist/ (`npm run build`; `npm ci` in a clone and `npm pack` build it). No TypeScript loader at
// run time: what runs is what ships.
import { existsSync } from 'node:fs';

const main = new URL('../dist/cli/main.js', import.meta.url);
if (!existsSync(main)) {
  process.stderr.write('kvroute: the compiled CLI (dist/cli/main.js) is missing: run `npm run build` in the kvroute checkout\n');
  process.exit(1);
}
await import(main.href);
