/** The --help sections settings are listed under, shared by every command that takes them. */
export const GROUPS = {
  listen: 'Listening and workers:',
  routing: 'Routing:',
  admission: 'Admission, queue and retries:',
  tokenizer: 'Tokenizer:',
  security: 'Security:',
  clients: 'Client limits:',
  health: 'Worker health and circuit breaker:',
  observability: 'Metrics and logs:',
  record: 'Traffic recording (docs/cache-sizing.md#record-and-replay):',
  flow: 'Flow control, tenants and sessions (docs/flow-control.md):',
  scaleOut: 'Scale-out (NATS JetStream):',
  mock: 'Embedded mock fleet (when no worker is given):',
  k8s: 'Kubernetes discovery (docs/kubernetes.md):',
  epp: 'Endpoint picker (kvroute epp; docs/endpoint-picker.md):',
} as const;
