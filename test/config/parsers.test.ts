/** The shared value parsers: the forms every command accepts, and the one message shape they refuse with. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  boolText,
  bytesText,
  choiceArg,
  describeInt,
  describeNumber,
  durationArg,
  formatBytes,
  intArg,
  intText,
  numberArg,
  numberListArg,
  numberText,
  splitList,
  UsageError,
} from '../../src/config/parsers.ts';

describe('text -> value', () => {
  it('reads decimal integers only', () => {
    expect(intText('12')).toBe(12);
    expect(intText(' -3 ')).toBe(-3);
    for (const bad of ['', ' ', '1e3', '0x10', '1.0', '1.5', '12abc', 'Infinity', '9007199254740993'])
      expect(intText(bad), bad).toBeUndefined();
  });

  it('reads finite decimal numbers only', () => {
    expect(numberText('0.5')).toBe(0.5);
    expect(numberText('.25')).toBe(0.25);
    expect(numberText('1e-3')).toBe(0.001);
    for (const bad of ['', 'Infinity', 'NaN', '0x10', '1,5', '1e999']) expect(numberText(bad), bad).toBeUndefined();
  });

  it('reads switches, sizes, durations and lists', () => {
    expect([boolText('TRUE'), boolText('0'), boolText('yes'), boolText('off'), boolText('maybe')]).toEqual([
      true,
      false,
      true,
      false,
      undefined,
    ]);
    expect([bytesText('32mb'), bytesText('512K'), bytesText('1.5kb'), bytesText('1048576'), bytesText('1 gb')]).toEqual([
      32 * 1024 ** 2,
      512 * 1024,
      1536,
      1048576,
      1024 ** 3,
    ]);
    for (const bad of ['', '32 parsecs', '-1mb', 'mb']) expect(bytesText(bad), bad).toBeUndefined();
    expect(splitList('a, b  c,,d')).toEqual(['a', 'b', 'c', 'd']);
  });

  it('property: formatBytes and bytesText round-trip, choosing the largest exact unit', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 2 ** 40 }), (n) => {
        const text = formatBytes(n);
        expect(bytesText(text)).toBe(n);
        if (n % 1024 === 0) expect(text).toMatch(/[kmg]b$/);
      }),
      { numRuns: 500 },
    );
    expect(formatBytes(32 * 1024 * 1024)).toBe('32mb');
  });

  it('property: every safe integer reads back from its decimal text', () => {
    fc.assert(
      fc.property(fc.maxSafeInteger(), (n) => {
        expect(intText(String(n))).toBe(n);
      }),
    );
  });

  it('describes ranges in words', () => {
    expect(describeInt({ min: 0 })).toBe('an integer >= 0');
    expect(describeInt({ min: 0, max: 65535 })).toBe('an integer in [0, 65535]');
    expect(describeInt({ min: 0, minExclusive: true })).toBe('an integer >= 1');
    expect(describeNumber({ min: 0, max: 1, minExclusive: true })).toBe('a number in (0, 1]');
    expect(describeNumber({ min: 0, minExclusive: true })).toBe('a number > 0');
  });
});

describe('commander parsers', () => {
  const refuses = (parse: (t: string) => unknown, text: string, message: string) => {
    expect(() => parse(text)).toThrow(UsageError);
    expect(() => parse(text)).toThrow(message);
  };

  it('accept values in range and refuse the rest as "<flag> must be <range>, got "<text>""', () => {
    expect(intArg('--port', { min: 0, max: 65535 })('8080')).toBe(8080);
    refuses(intArg('--port', { min: 0, max: 65535 }), '70000', '--port must be an integer in [0, 65535], got "70000"');
    refuses(intArg('--block-size', { min: 1 }), 'zero', '--block-size must be an integer >= 1, got "zero"');
    refuses(intArg('--block-size', { min: 1 }), '0', '--block-size must be an integer >= 1, got "0"');
    expect(numberArg('--fp-mfu', { min: 0.001, max: 1 })('0.4')).toBe(0.4);
    refuses(numberArg('--fp-mfu', { min: 0.001, max: 1 }), '1.5', '--fp-mfu must be a number in [0.001, 1], got "1.5"');
    expect(numberArg('--rate', { min: 0, minExclusive: true }, { infinity: true })('inf')).toBe(Infinity);
    refuses(numberArg('--rate', { min: 0, minExclusive: true }), 'inf', '--rate must be a number > 0, got "inf"');
    expect(numberListArg('--rate-scale', { min: 0, minExclusive: true })('0.5,1,2')).toEqual([0.5, 1, 2]);
    refuses(
      numberListArg('--rate-scale', { min: 0, minExclusive: true }),
      '1,0',
      '--rate-scale must be comma-separated numbers, each > 0, got "1,0"',
    );
    expect(durationArg('--window')('2m')).toBe(120);
    refuses(durationArg('--window'), '0s', '--window must be a positive duration like 60s, 2m, 500ms or 1h, got "0s"');
    expect(choiceArg('--flavor', ['vllm', 'sglang'])('sglang')).toBe('sglang');
    refuses(choiceArg('--flavor', ['vllm', 'sglang']), 'trt', '--flavor must be one of vllm, sglang, got "trt"');
  });
});
