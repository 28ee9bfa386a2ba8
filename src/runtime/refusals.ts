/**
 * A refusal of the core dispatcher as the HTTP answer a client can act on: status, OpenAI-shaped error, Retry-After.
 * Shared by every shell that answers HTTP (the router; a gateway's endpoint picker answers with the same statuses).
 */
import type { DispatchRefusal, RefusalCode } from '../core/dispatch/dispatcher.ts';
import { type ErrorCode, type ErrorType, HttpError } from '../http/errors.ts';

interface Shape {
  readonly status: number;
  readonly type: ErrorType;
  readonly code: ErrorCode;
  /** Retry-After in seconds, when waiting can help; `probe` = one health-probe interval. */
  readonly retryAfter?: number | 'probe' | 'queue' | 'given';
}

const SHAPES: Record<RefusalCode, Shape> = {
  no_workers: { status: 503, type: 'service_unavailable', code: 'no_workers', retryAfter: 'probe' },
  model_not_found: { status: 404, type: 'not_found_error', code: 'model_not_found' },
  no_workers_for_role: { status: 503, type: 'service_unavailable', code: 'no_workers_for_role', retryAfter: 'probe' },
  no_healthy_workers: { status: 503, type: 'service_unavailable', code: 'no_healthy_workers', retryAfter: 'probe' },
  subset_unavailable: { status: 503, type: 'service_unavailable', code: 'subset_unavailable' },
  queue_full: { status: 503, type: 'service_unavailable', code: 'queue_full', retryAfter: 1 },
  queue_timeout: { status: 503, type: 'service_unavailable', code: 'queue_timeout', retryAfter: 'queue' },
  shed: { status: 429, type: 'rate_limit_error', code: 'shed', retryAfter: 'given' },
  token_budget_exceeded: { status: 429, type: 'rate_limit_error', code: 'token_budget_exceeded', retryAfter: 'given' },
  deadline_unmeetable: { status: 429, type: 'rate_limit_error', code: 'deadline_unmeetable', retryAfter: 1 },
  upstream_failed: { status: 502, type: 'upstream_error', code: 'upstream_error' },
  duplicate_request: { status: 409, type: 'invalid_request_error', code: 'duplicate_request' },
  closed: { status: 503, type: 'service_unavailable', code: 'shutting_down', retryAfter: 1 },
};

export interface RefusalTimes {
  readonly healthIntervalMs: number;
  readonly queueTimeoutMs: number;
}

export function refusalError(r: Pick<DispatchRefusal, 'code' | 'message' | 'retryAfterMs'>, times: RefusalTimes): HttpError {
  const shape = SHAPES[r.code];
  const headers: Record<string, string> = {};
  const after =
    shape.retryAfter === 'probe'
      ? times.healthIntervalMs / 1000
      : shape.retryAfter === 'queue'
        ? times.queueTimeoutMs / 1000
        : shape.retryAfter === 'given'
          ? (r.retryAfterMs ?? 1000) / 1000
          : shape.retryAfter;
  if (after !== undefined) headers['retry-after'] = String(Math.max(1, Math.ceil(after)));
  return new HttpError(shape.status, r.message, shape.type, shape.code, r.code === 'model_not_found' ? 'model' : null, headers);
}

/**
 * The header the reference endpoint picker names a flow-control drop with, and its values
 * (llm-d/llm-d-inference-scheduler pkg/common/error/error.go @520af478: RequestDroppedReasonHeaderKey).
 */
export const DROPPED_REASON_HEADER = 'x-llm-d-request-dropped-reason';
export type DroppedReason = 'rejected-saturated' | 'rejected-ttl-expired';

/**
 * Where the endpoint picker answers otherwise than serve: the reference picker maps a capacity rejection to 429 and a
 * request that expired in its queue to 503, each with the dropped-reason header (llm-d-inference-scheduler
 * pkg/epp/requestcontrol/admission.go translateFlowControlOutcome, pkg/common/error/error.go BuildErrResponse
 * @520af478; the Endpoint Picker Protocol, gateway-api-inference-extension
 * docs/proposals/004-endpoint-picker-protocol @84436a96: 429 for a dropped request). serve keeps 503 for a full queue.
 */
const PICKER: Partial<Record<RefusalCode, { readonly status: number; readonly type: ErrorType; readonly reason: DroppedReason }>> = {
  queue_full: { status: 429, type: 'rate_limit_error', reason: 'rejected-saturated' },
  shed: { status: 429, type: 'rate_limit_error', reason: 'rejected-saturated' },
  queue_timeout: { status: 503, type: 'service_unavailable', reason: 'rejected-ttl-expired' },
};

/** A refusal as the endpoint picker's immediate response: serve's answer with the picker's status and drop reason. */
export function pickerRefusalError(r: Pick<DispatchRefusal, 'code' | 'message' | 'retryAfterMs'>, times: RefusalTimes): HttpError {
  const base = refusalError(r, times);
  const p = PICKER[r.code];
  if (!p) return base;
  return new HttpError(p.status, base.message, p.type, base.code, base.param, { ...base.headers, [DROPPED_REASON_HEADER]: p.reason });
}
