/**
 * The mock engine's side of each engine's handoff, by engine name (src/engines/NAME/mock.ts), kept apart from the
 * router's registry (./index.ts) so a router never loads the mock's code.
 */
import type { EngineName } from '../core/types.ts';
import type { MockHandoff } from './mock-handoff.ts';
import { sglangMock } from './sglang/mock.ts';
import { trtllmMock } from './trtllm/mock.ts';
import { vllmMock } from './vllm/mock.ts';

const MOCKS: Readonly<Record<EngineName, MockHandoff>> = { vllm: vllmMock, sglang: sglangMock, trtllm: trtllmMock };

export function mockHandoff(name: EngineName): MockHandoff {
  return MOCKS[name];
}
