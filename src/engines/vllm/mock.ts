/**
 * vLLM's disaggregated handoff, engine side, for the mock engine (the P side per
 * vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py @053da34be7ea `request_finished`):
 *
 * prefill  a request with kv_transfer_params.do_remote_decode runs as usual (the router sends max_tokens 1); at the end
 *          its blocks stay pinned for a lease and the answer carries kv_transfer_params {do_remote_prefill: true,
 *          remote_block_ids, remote_engine_id, remote_request_id, remote_host, remote_port, tp_size} (the mock's
 *          decode side pulls over a side channel on the prefill's HTTP port, which ends the lease). A first token that
 *          ends the request (EOS: FINISHED_STOPPED, not length-capped) gets no params, as vLLM sends none then.
 * decode   a request with kv_transfer_params.do_remote_prefill pulls the KV it does not hold, then decodes; the lease
 *          gone: kv_load_failure_policy fail (an error) or recompute (the prompt computed here).
 */
import { isObject, type MockHandoff, type PdPlan } from '../mock-handoff.ts';

export const vllmMock: MockHandoff = {
  name: 'vllm',
  async plan(host, leg): Promise<PdPlan | null> {
    const ktp = leg.body.kv_transfer_params;
    if (!isObject(ktp)) return null;
    if (leg.role === 'prefill' && ktp.do_remote_decode === true) {
      if (leg.eosFirstToken) return { maxTokens: 1, choiceExtra: () => ({ finish_reason: 'stop' }) };
      const leaseId = `${host.engineId}-lease-${host.nextSeq()}`;
      return {
        ...host.lease(leg.prompt, leaseId),
        extra: () => ({
          kv_transfer_params: {
            do_remote_prefill: true,
            do_remote_decode: false,
            remote_block_ids: [Array.from({ length: Math.ceil(leg.prompt.length / host.blockSize) }, (_, i) => i)],
            remote_engine_id: host.engineId,
            remote_request_id: leaseId,
            remote_host: host.host,
            remote_port: host.httpPort(),
            tp_size: 1,
          },
        }),
      };
    }
    if (leg.role === 'decode' && ktp.do_remote_prefill === true) {
      const local = leg.localHitTokens();
      const got = await host.pull({ host: ktp.remote_host, port: ktp.remote_port, leaseId: ktp.remote_request_id });
      if ('error' in got) {
        if (host.loadFailurePolicy === 'fail') return { failure: `KV load failed: ${got.error}` };
        return {}; // recompute: the prompt is computed here
      }
      await host.transfer(Math.max(0, leg.prompt.length - local));
      return { preloadedTokens: leg.prompt.length };
    }
    return null;
  },
};
