// 503 when the queue is full (server: --max-num-seqs 2 --max-queued-requests 2, so 4 requests at
// most are running or waiting); the admitted ones still complete, and room comes back.
import { request, check, done, waitIdle } from './lib.mjs';

const body = { prompt: 'Ann has 3 apples', max_tokens: 300, ignore_eos: true };
const results = await Promise.all(Array.from({ length: 12 }, () => request('POST', '/v1/completions', { body })));
const ok = results.filter((r) => r.status === 200), busy = results.filter((r) => r.status === 503);
check(ok.length >= 4, `at least the 4 admitted requests completed (${ok.length})`);
check(busy.length >= 1, `some requests were refused with 503 (${busy.length})`);
check(ok.length + busy.length === 12, 'every request got 200 or 503');
check(busy.every((r) => JSON.parse(r.body).error.message.includes('at capacity')), '503 says the server is at capacity');
check(ok.every((r) => JSON.parse(r.body).usage.completion_tokens === 300), 'admitted requests ran to max_tokens');
await waitIdle();
const after = await request('POST', '/v1/completions', { body: { prompt: 'x', max_tokens: 2 } });
check(after.status === 200, 'room again once the queue drained');
done('queue_full');
