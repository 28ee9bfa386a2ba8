/** How a chosen SGLang release reads a request's data-parallel rank (mock.ts describes each; docs/engines.md "SGLang DP ranks"). */
export const SGLANG_DP_ROUTINGS = ['header', 'body', 'legacy-body', 'room'] as const;
export type SglangDpRouting = (typeof SGLANG_DP_ROUTINGS)[number];
