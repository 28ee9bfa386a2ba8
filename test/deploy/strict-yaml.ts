/**
 * A second, stricter reading of the manifests than the `yaml` package's default: kustomize and kubectl read YAML with
 * Go's YAML 1.1 scanner (sigs.k8s.io/yaml over go-yaml), PyYAML with libyaml's rules, and both refuse or read
 * differently some text that a YAML 1.2 parser accepts. Each manifest file must pass all of:
 *
 * - `yaml` in strict mode: syntax errors, warnings and duplicate keys are errors (go-yaml v3 refuses duplicate keys);
 * - flow collections as YAML 1.1 scans them: a plain scalar inside `{...}` or `[...]` ends at `?` (libyaml and go-yaml
 *   list `?` with `,[]{}` among the flow indicators that end a plain scalar), so `{ path: /healthz?x, port: 1 }` is a
 *   syntax error there ("did not find expected ',' or '}'") and must be quoted;
 * - the same values under the YAML 1.1 and 1.2 schemas: `no`, `on`, `010`, `1:20` are a string and numbers in 1.2 but
 *   false, true, 8 and 80 under YAML 1.1, so an unquoted one means something else to kubectl.
 */
import { type CST, Parser, parseAllDocuments } from 'yaml';

type Token = CST.Token | CST.CollectionItem['key'] | CST.CollectionItem['value'];

function lineOf(text: string, offset: number): number {
  let n = 1;
  for (let i = 0; i < offset && i < text.length; i++) if (text.charCodeAt(i) === 10) n++;
  return n;
}

/** Plain scalars inside flow collections that YAML 1.1 would end early. */
function flowScalarErrors(text: string): string[] {
  const out: string[] = [];
  const walk = (t: Token | null | undefined, inFlow: boolean): void => {
    if (!t || typeof t !== 'object') return;
    switch (t.type) {
      case 'document':
        walk(t.value, false);
        return;
      case 'block-map':
      case 'block-seq':
        for (const it of t.items) {
          walk(it.key, false);
          walk(it.value, false);
        }
        return;
      case 'flow-collection':
        for (const it of t.items) {
          walk(it.key, true);
          walk(it.value, true);
        }
        return;
      case 'scalar':
        if (inFlow && t.source.includes('?')) {
          out.push(
            `line ${lineOf(text, t.offset)}: plain scalar ${JSON.stringify(t.source)} inside a flow collection contains "?", ` +
              'which ends it under YAML 1.1 (kubectl, kustomize, PyYAML): quote it',
          );
        }
        return;
      default:
        return;
    }
  };
  for (const token of new Parser().parse(text)) walk(token as Token, false);
  return out;
}

/** The first path where two JS values differ, or null. */
function firstDifference(a: unknown, b: unknown, path: string): string | null {
  if (typeof a !== typeof b || Array.isArray(a) !== Array.isArray(b) || (a === null) !== (b === null)) return path || '/';
  if (a !== null && typeof a === 'object') {
    const ka = Object.keys(a as object);
    const kb = Object.keys(b as object);
    if (ka.length !== kb.length) return path || '/';
    for (const k of ka) {
      const d = firstDifference((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], `${path}/${k}`);
      if (d !== null) return d;
    }
    return null;
  }
  return Object.is(a, b) ? null : path || '/';
}

/** Every reason Go's YAML (or PyYAML) would refuse or misread this text; empty when it reads it as `yaml` does. */
export function strictYamlErrors(text: string): string[] {
  const errors: string[] = [];
  const v12 = parseAllDocuments(text, { strict: true, uniqueKeys: true, prettyErrors: true, version: '1.2' });
  const docs = Array.isArray(v12) ? v12 : [v12];
  for (const d of docs) for (const e of [...d.errors, ...d.warnings]) errors.push(e.message.split('\n')[0]);
  if (errors.length > 0) return errors;
  errors.push(...flowScalarErrors(text));
  const v11 = parseAllDocuments(text, { strict: true, uniqueKeys: true, version: '1.1' });
  const docs11 = Array.isArray(v11) ? v11 : [v11];
  docs.forEach((d, i) => {
    const diff = firstDifference(d.toJS(), docs11[i]?.toJS(), '');
    if (diff !== null) errors.push(`document ${i + 1} ${diff}: YAML 1.1 (kubectl) reads this value differently from YAML 1.2: quote it`);
  });
  return errors;
}
