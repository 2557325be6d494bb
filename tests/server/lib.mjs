// Helpers for the server tests (Node's own http module; no framework).
import http from 'node:http';

export const URL_BASE = process.env.OSPREY_URL;
if (!URL_BASE) throw new Error('OSPREY_URL is not set (run through scripts/server_test.sh)');
export const API_KEY = process.env.OSPREY_API_KEY || '';

let failures = 0;
export function check(cond, what) {
  if (!cond) {
    failures++;
    console.error(`FAIL: ${what}`);
  }
}
export function done(name) {
  if (failures) {
    console.error(`${name}: ${failures} check(s) failed`);
    process.exit(1);
  }
  console.log(`${name}: all checks passed`);
}

// One request; resolves {status, headers, body} (body as a string).
export function request(method, path, { body, headers = {}, raw = false, auth = true } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(path, URL_BASE);
    const h = { ...headers };
    if (auth && API_KEY && !('Authorization' in h)) h.Authorization = `Bearer ${API_KEY}`;
    let data = null;
    if (body !== undefined) {
      data = raw ? body : Buffer.from(JSON.stringify(body));
      if (!Buffer.isBuffer(data)) data = Buffer.from(data);
      h['Content-Type'] = h['Content-Type'] || 'application/json';
      h['Content-Length'] = data.length;
    }
    const req = http.request(u, { method, headers: h, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

export async function metrics() {
  const r = await request('GET', '/metrics');
  const out = {};
  for (const line of r.body.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Waits until the engine has nothing running or waiting and holds no KV block.
export async function waitIdle(timeoutMs = 20000) {
  const t0 = Date.now();
  for (;;) {
    const m = await metrics();
    if (m.osprey_num_requests_running === 0 && m.osprey_num_requests_waiting === 0 && m.osprey_kv_cache_usage_perc === 0) return m;
    if (Date.now() - t0 > timeoutMs) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
}
