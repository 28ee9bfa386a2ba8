// Worker-thread entry of the tokenizer pool: registers tsx's loader in this thread (loader hooks registered on the main
// thread do not reach workers), then runs the TypeScript worker body.
import { register } from 'tsx/esm/api';

register();
await import('./thread.ts');
