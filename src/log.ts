/**
 * The one logging interface of modules below the CLI (ingestion, transports, replicas): structured object + message,
 * so a shell can hand in pino (`{info: (o, m) => log.info(o, m), ...}`) and tests a silent sink.
 */
export interface LogSink {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

export const quietLog: LogSink = { info() {}, warn() {}, error() {} };

const json = (obj: object) => JSON.stringify(obj, (_k, v) => (typeof v === 'bigint' ? v.toString() : v));

/** Warnings and errors on stderr, for library use without a logger. */
export const consoleLog: LogSink = {
  info() {},
  warn: (obj, msg) => console.warn(`[kvroute] ${msg}`, json(obj)),
  error: (obj, msg) => console.error(`[kvroute] ${msg}`, json(obj)),
};
