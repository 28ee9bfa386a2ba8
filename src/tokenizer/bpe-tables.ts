/**
 * A tokenizer.json's `Tokenizer` (@huggingface/tokenizers), built with cheaper tables when its model is BPE.
 *
 * The library's BPE constructor builds its vocabulary map with `new Map(Object.entries(vocab))` and its merge ranks as
 * a Map keyed by `JSON.stringify([left, right])`, and every merge lookup while encoding stringifies a pair again. For
 * Qwen3 (151,643 tokens, 151,387 merges) that construction is ~450 ms of CPU, paid by every `kvroute serve` with a
 * tokenizer (its tokenizer thread) and by every mock engine process with one. Here the model is constructed with an
 * empty vocabulary and no merges, then given the same tables built directly: the vocabulary map filled key by key, and
 * the ranks as a two-level Map (left token, then right token), which `add_node` reads without building a string.
 * Encodes are identical (test/tokenizer/bpe-tables.test.ts compares both tokenizers' ids and tables); about half the
 * construction time (bench/RESULTS.md, "Tokenizer load").
 *
 * The fields set here are the library's BPE model's own (@huggingface/tokenizers is pinned to one version in
 * package.json): `tokens_to_ids`, `vocab`, `merges`, `bpe_ranks`, `unk_token_id` and the method `add_node`. A model
 * that is not BPE, or a tokenizer.json whose tables are not the plain shapes this reads, is built the library's way.
 */
import { Tokenizer } from '@huggingface/tokenizers';

type Json = Record<string, unknown>;

/** The parts of the library's BPE model this file replaces (see the file comment). */
interface BpeModel {
  tokens_to_ids: Map<string, number>;
  vocab: string[];
  merges: [string, string][];
  bpe_ranks: { get(key: string): number | undefined };
  unk_token_id: number | undefined;
  add_node(queue: { push(node: unknown): void }, node: BpeNode): void;
}

/** The Tokenizer's own fields this file reads (private in the library's types). */
interface TokenizerFields {
  model: unknown;
  added_tokens: { content: string; id: number }[];
  added_tokens_map: Map<string, unknown>;
}

interface BpeNode {
  token: string;
  bias: number;
  score?: number;
  next: BpeNode | null;
}

/** Merge ranks by left token, then right token: a pair listed twice has its last rank, as in the library's Map. */
type Ranks = Map<string, Map<string, number>>;

function isPlainBpe(model: unknown): model is Json & { vocab: Record<string, number>; merges: (string | [string, string])[] } {
  if (typeof model !== 'object' || model === null) return false;
  const m = model as Json;
  return (
    m.type === 'BPE' &&
    typeof m.vocab === 'object' &&
    m.vocab !== null &&
    !Array.isArray(m.vocab) &&
    Array.isArray(m.merges) &&
    m.merges.length > 0 &&
    (m.merges.every((x) => typeof x === 'string') ||
      m.merges.every((x) => Array.isArray(x) && x.length === 2 && typeof x[0] === 'string' && typeof x[1] === 'string'))
  );
}

/** A `Tokenizer` for a parsed tokenizer.json and tokenizer_config.json: the library's, with BPE tables built cheaply. */
export function createTokenizer(tokenizerJson: Json, config: Json): Tokenizer {
  const spec = tokenizerJson.model;
  if (!isPlainBpe(spec)) return new Tokenizer(tokenizerJson, config);
  // The library's own construction with nothing to tabulate: normalizer, pre-tokenizer, decoder, added tokens.
  const tokenizer = new Tokenizer({ ...tokenizerJson, model: { ...spec, vocab: {}, merges: [] } }, config);
  const fields = tokenizer as unknown as TokenizerFields;
  const model = fields.model as BpeModel;
  if (!(model.tokens_to_ids instanceof Map) || typeof model.add_node !== 'function' || !Array.isArray(model.vocab)) {
    return new Tokenizer(tokenizerJson, config); // not the model this file knows: the library's way
  }

  const ids = new Map<string, number>();
  const vocab = spec.vocab;
  for (const token in vocab) ids.set(token, vocab[token]);
  const tokens = new Array<string>(ids.size);
  for (const [token, id] of ids) tokens[id] = token;
  // The library's split of the old "left right" format: at the first space, two parts at most.
  const merges = (typeof spec.merges[0] === 'string' ? (spec.merges as string[]).map((x) => x.split(' ', 2)) : spec.merges) as [
    string,
    string,
  ][];
  const ranks: Ranks = new Map();
  for (let i = 0; i < merges.length; i++) {
    const [left, right] = merges[i];
    let byRight = ranks.get(left);
    if (byRight === undefined) {
      byRight = new Map();
      ranks.set(left, byRight);
    }
    byRight.set(right, i);
  }

  model.tokens_to_ids = ids;
  model.vocab = tokens;
  model.merges = merges;
  model.unk_token_id = ids.get(spec.unk_token as string);
  // Anything else that reads the ranks by the library's key gets the same answer.
  model.bpe_ranks = {
    get(key: string): number | undefined {
      const pair = JSON.parse(key) as [string, string];
      return ranks.get(pair[0])?.get(pair[1]);
    },
  };
  model.add_node = (queue, node) => {
    const rank = ranks.get(node.token)?.get(node.next!.token);
    if (rank !== undefined) {
      node.score = rank + node.bias;
      queue.push(node);
    }
  };
  // The Tokenizer's constructor put its added tokens into the empty tables: into these, as it does.
  for (const added of fields.added_tokens) {
    ids.set(added.content, added.id);
    tokens[added.id] = added.content;
  }
  return tokenizer;
}

/**
 * `tokenizer.get_vocab(false).size` (the vocabulary without added tokens) without building that Map of every token:
 * the model's tokens that are not added tokens, and one more when the ids have gaps (the library's Map has one
 * `undefined` key for all of them).
 */
export function regularVocabSize(tokenizer: Tokenizer): number {
  const fields = tokenizer as unknown as TokenizerFields;
  const vocab = (fields.model as { vocab: (string | undefined)[] }).vocab;
  const added = fields.added_tokens_map;
  let n = 0;
  let gaps = false;
  for (let i = 0; i < vocab.length; i++) {
    const token = vocab[i];
    if (token === undefined) gaps = true;
    else if (!added.has(token)) n++;
  }
  return gaps ? n + 1 : n;
}
