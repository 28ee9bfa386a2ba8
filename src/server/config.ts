/**
 * The serve settings moved to src/config (one schema: src/config/serve.ts; worker specs: src/config/worker-spec.ts).
 * This module re-exports them so existing importers keep compiling; new code imports src/config directly.
 */
export { DEFAULTS, loadConfigFile, type ServeConfig } from '../config/serve.ts';
export { parseWorkerSpec, type WorkerSpec, workerFromUnknown } from '../config/worker-spec.ts';
