// Many clients: 1,000 concurrent streaming requests complete with no error and no leaked block;
// a stalled client (never reads) does not delay the others; a client that disconnects mid-stream
// has its request aborted and its blocks freed.
import http from 'node:http';
import { URL_BASE, request, check, done, waitIdle, metrics } from './lib.mjs';

// A streaming completion read to the end; resolves {ok, tokens, text, ms, error}.
function stream(body, { onChunk } = {}) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const data = Buffer.from(JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }));
    const req = http.request(new URL('/v1/completions', URL_BASE), {
      method: 'POST', agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': data.length } }, (res) => {
      let buf = '', text = '', tokens = -1, sawDone = false, chunks = 0;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!ev.startsWith('data: ')) continue;
          const payload = ev.slice(6);
          if (payload === '[DONE]') { sawDone = true; continue; }
          const j = JSON.parse(payload);
          if (j.choices.length) { text += j.choices[0].text; chunks++; if (onChunk) onChunk(chunks, req); }
          if (j.usage) tokens = j.usage.completion_tokens;
        }
      });
      res.on('end', () => resolve({ ok: res.statusCode === 200 && sawDone, status: res.statusCode, tokens, text, ms: Date.now() - t0 }));
      res.on('error', (e) => resolve({ ok: false, error: String(e), ms: Date.now() - t0 }));
    });
    req.on('error', (e) => resolve({ ok: false, error: String(e), ms: Date.now() - t0 }));
    req.end(data);
  });
}

const small = (i) => ({ prompt: `Request ${i}: Ann has ${i % 97} apples.`, max_tokens: 16, ignore_eos: true, temperature: 0 });

// 1. A thousand at once.
const t0 = Date.now();
const all = await Promise.all(Array.from({ length: 1000 }, (_, i) => stream(small(i))));
const failed = all.filter((r) => !r.ok || r.tokens !== 16);
check(failed.length === 0, `1000 concurrent streams: ${failed.length} failed (first: ${JSON.stringify(failed[0])})`);
console.log(`1000 concurrent streams in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
let m = await waitIdle();
check(m.osprey_kv_cache_usage_perc === 0 && m.osprey_num_requests_running === 0, 'no leaked block after 1000 streams');
check(m['osprey_request_success_total{finished_reason="length"}'] >= 1000, 'all 1000 counted in /metrics');

// 2. A stalled client: a long stream whose reader never reads.
const base = Date.now();
await Promise.all(Array.from({ length: 20 }, (_, i) => stream(small(i))));
const baseline = Date.now() - base;
let stalledReq = null;
const stalled = new Promise((resolve) => {
  const data = Buffer.from(JSON.stringify({ prompt: 'stall', max_tokens: 800, ignore_eos: true, stream: true }));
  stalledReq = http.request(new URL('/v1/completions', URL_BASE), { method: 'POST', agent: false,
    headers: { 'Content-Type': 'application/json', 'Content-Length': data.length } }, (res) => {
    res.pause();  // never read: the server's writes back up behind this client
    resolve(res);
  });
  stalledReq.on('error', () => {});
  stalledReq.end(data);
});
await stalled;
const withStall = Date.now();
const others = await Promise.all(Array.from({ length: 20 }, (_, i) => stream(small(i + 5000))));
const stallTime = Date.now() - withStall;
check(others.every((r) => r.ok && r.tokens === 16), 'others complete beside a stalled client');
// A generous bound (CI machines are noisy); a server that waited on the stalled client would never
// finish these at all (the stalled stream is 800 tokens long and never read).
check(stallTime < 5 * baseline + 5000, `a stalled client does not hold the others back (${stallTime} ms vs ${baseline} ms without)`);
stalledReq.destroy();

// 3. A client that disconnects mid-stream: its request is aborted and its blocks freed.
const before = await metrics();
const cut = await stream({ prompt: 'disconnect me', max_tokens: 2000, ignore_eos: true }, {
  onChunk: (n, req) => { if (n === 3) req.destroy(); } });
check(!cut.ok, 'the cut stream did not complete');
const tCut = Date.now();
m = await waitIdle(10000);
check(m.osprey_num_requests_running === 0 && m.osprey_kv_cache_usage_perc === 0,
      `the aborted request freed its blocks (${Date.now() - tCut} ms after the disconnect)`);
check(m.osprey_generation_tokens_total - before.osprey_generation_tokens_total < 2000,
      'generation stopped early (fewer than max_tokens generated)');
done('load');
