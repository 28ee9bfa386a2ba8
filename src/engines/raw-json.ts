/**
 * The exact source text of a top-level member of a JSON object, for values that must travel byte for byte: vLLM's
 * kv_transfer_params are opaque and grow by release (a router re-serialising them could change a number's form), and
 * SGLang's bootstrap_room is an integer up to 2^63 that JSON.parse would round. The text must already be valid JSON
 * (parse it first); this only finds where the member's value starts and ends.
 */

function skipSpace(s: string, i: number): number {
  while (i < s.length && (s[i] === ' ' || s[i] === '\n' || s[i] === '\r' || s[i] === '\t')) i++;
  return i;
}

function skipString(s: string, i: number): number {
  // s[i] is the opening quote; returns the index after the closing one.
  for (let j = i + 1; j < s.length; j++) {
    if (s[j] === '\\') j++;
    else if (s[j] === '"') return j + 1;
  }
  return s.length;
}

function skipValue(s: string, i: number): number {
  const c = s[i];
  if (c === '"') return skipString(s, i);
  if (c === '{' || c === '[') {
    let depth = 0;
    for (let j = i; j < s.length; j++) {
      const d = s[j];
      if (d === '"') {
        j = skipString(s, j) - 1;
        continue;
      }
      if (d === '{' || d === '[') depth++;
      else if (d === '}' || d === ']') {
        depth--;
        if (depth === 0) return j + 1;
      }
    }
    return s.length;
  }
  let j = i;
  while (j < s.length && s[j] !== ',' && s[j] !== '}' && s[j] !== ']' && s[j] !== ' ' && s[j] !== '\n' && s[j] !== '\r' && s[j] !== '\t')
    j++;
  return j;
}

/**
 * Walks the top-level members of the object `json` in order, calling `visit` with each key and its value's span until
 * it returns true. False when `json` is no object or a member is malformed before its value (a bad key or no colon);
 * anything after the last well-formed member (a missing comma, the closing brace) ends the walk.
 */
function scanMembers(json: string, visit: (name: string, start: number, end: number) => boolean): boolean {
  let i = skipSpace(json, 0);
  if (json[i] !== '{') return false;
  i = skipSpace(json, i + 1);
  while (i < json.length && json[i] === '"') {
    const keyEnd = skipString(json, i);
    const name = JSON.parse(json.slice(i, keyEnd)) as string;
    i = skipSpace(json, keyEnd);
    if (json[i] !== ':') return false;
    i = skipSpace(json, i + 1);
    const end = skipValue(json, i);
    if (visit(name, i, end)) return true;
    i = skipSpace(json, end);
    if (json[i] !== ',') return true;
    i = skipSpace(json, i + 1);
  }
  return true;
}

/** The raw text of `key`'s value in the top-level object `json`, or undefined when absent (or `json` is no object). */
export function rawMember(json: string, key: string): string | undefined {
  let found: string | undefined;
  scanMembers(json, (name, start, end) => {
    if (name !== key) return false;
    found = json.slice(start, end);
    return true;
  });
  return found;
}

/** The raw text of the first element of the array `json`, or undefined when it is empty (or `json` is no array). */
export function rawFirstElement(json: string): string | undefined {
  const i = skipSpace(json, 0);
  if (json[i] !== '[') return undefined;
  const start = skipSpace(json, i + 1);
  if (start >= json.length || json[start] === ']') return undefined;
  return json.slice(start, skipValue(json, start));
}

/** The members of the object `json` as (key, raw value text) pairs, in order; undefined when `json` is no object. */
export function rawMembers(json: string): [string, string][] | undefined {
  const out: [string, string][] = [];
  const ok = scanMembers(json, (name, start, end) => {
    out.push([name, json.slice(start, end)]);
    return false;
  });
  return ok ? out : undefined;
}

/** `json` (an object's text) with `members` (already-encoded JSON values by key) appended before its closing brace. */
export function appendMembers(json: string, members: ReadonlyArray<readonly [string, string]>): string {
  const end = json.lastIndexOf('}');
  const empty = /^\s*\{\s*$/.test(json.slice(0, end));
  const add = members.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(',');
  return `${json.slice(0, end)}${empty || add === '' ? '' : ','}${add}}`;
}
