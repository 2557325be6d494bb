// Graceful shutdown: streams in flight when the server gets a signal, and no client left hanging.
//   node shutdown.mjs drain|abort SIGNAL TIMEOUT_S
// drain: the server was started with a --shutdown-timeout long enough for the short requests in
//        flight: each finishes normally (finish_reason, usage, [DONE]).
// abort: the requests are far longer than the timeout: each stream ends within the timeout (plus
//        a flush grace) with a final error event (503, "shutting down") and [DONE]; a plain
//        request gets a 503 error object.
// Both: after the signal, new connections are refused; every client's response ends. The exit
// status (0) is checked by server_test.sh (OSPREY_EXPECT_EXIT=1).
import http from 'node:http';
import { check, done, URL_BASE } from './lib.mjs';

const [mode, signal, timeoutArg] = process.argv.slice(2);
const timeoutS = Number(timeoutArg);
const pid = Number(process.env.OSPREY_SERVER_PID);
check(['drain', 'abort'].includes(mode) && pid > 0 && timeoutS >= 0, 'arguments and OSPREY_SERVER_PID');
const kFlushGraceS = 2; // cmd_serve.cpp's kFlushGrace
const kSlackS = 3;      // scheduling on a busy 2-core machine

// One request, resolved when its response has ended (or failed): {status, body, firstChunk}.
function post(path, body, onFirstChunk) {
  return new Promise((resolve) => {
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request(new URL(path, URL_BASE), {
      method: 'POST', agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': data.length },
    }, (res) => {
      let text = '';
      let first = true;
      res.on('data', (c) => {
        text += c;
        if (first) { first = false; onFirstChunk?.(); }
      });
      res.on('end', () => resolve({ status: res.statusCode, body: text, ended: Date.now() }));
      res.on('error', (e) => resolve({ status: -1, body: text, error: String(e), ended: Date.now() }));
    });
    req.on('error', (e) => resolve({ status: -1, body: '', error: String(e), ended: Date.now() }));
    req.end(data);
  });
}

const long = mode === 'abort';
const nStreams = 6;
let started = 0;
let allStarted;
const startedP = new Promise((r) => { allStarted = r; });
const onFirst = () => { if (++started === nStreams) allStarted(); };
const streams = [];
for (let i = 0; i < nStreams; i++) {
  streams.push(post('/v1/completions', {
    prompt: `${i}+${i}=`, max_tokens: long ? 1000 : 48, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  }, onFirst));
}
const plain = post('/v1/completions', { prompt: '7+8=', max_tokens: long ? 1000 : 24, ignore_eos: true });
await startedP;

const t0 = Date.now();
process.kill(pid, signal);
await new Promise((r) => setTimeout(r, 500));
const late = await post('/v1/completions', { prompt: '1+1=', max_tokens: 2 });
check(late.status === -1 && /ECONNREFUSED|ECONNRESET/.test(late.error || ''),
      `a new connection after ${signal} is refused (got status ${late.status} ${late.error || late.body.slice(0, 100)})`);

const hardLimit = (timeoutS + kFlushGraceS + kSlackS) * 1000;
const results = await Promise.race([
  Promise.all([...streams, plain]),
  new Promise((r) => setTimeout(() => r(null), hardLimit + 5000).unref()),  // (unref: no wait at exit)
]);
check(results !== null, `every client's response ended (none hanging after ${hardLimit + 5000} ms)`);
if (results) {
  const plainRes = results.pop();
  let aborted = 0;
  results.forEach((r, i) => {
    const events = r.body.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
    check(r.status === 200, `stream ${i}: status ${r.status} ${r.error || ''}`);
    check(events.at(-1) === '[DONE]', `stream ${i}: ends with [DONE] (last: ${String(events.at(-1)).slice(0, 80)})`);
    check(r.ended - t0 <= hardLimit, `stream ${i}: ended ${r.ended - t0} ms after the signal (limit ${hardLimit})`);
    const json = events.filter((e) => e !== '[DONE]').map((e) => JSON.parse(e));
    const error = json.find((e) => e.error);
    const finish = json.flatMap((e) => e.choices || []).map((c) => c.finish_reason).find((f) => f);
    if (mode === 'drain') {
      check(!error && finish === 'length', `stream ${i}: finished normally (finish ${finish}, error ${JSON.stringify(error)})`);
      check(json.some((e) => e.usage && e.usage.completion_tokens === 48), `stream ${i}: usage with all 48 tokens`);
    } else if (error) {
      aborted++;
      check(error.error.code === 503 && /shutting down/.test(error.error.message),
            `stream ${i}: the error event says why (${JSON.stringify(error.error)})`);
    }
  });
  if (mode === 'drain') {
    check(plainRes.status === 200 && JSON.parse(plainRes.body).choices[0].finish_reason === 'length',
          `the plain request finished (${plainRes.status} ${plainRes.body.slice(0, 100)})`);
  } else {
    check(aborted === nStreams, `every long stream was aborted with an error event (${aborted} of ${nStreams})`);
    check(plainRes.status === 503 && /shutting down/.test(plainRes.body),
          `the plain request got a 503 (${plainRes.status} ${plainRes.body.slice(0, 120)})`);
    check(plainRes.ended - t0 <= hardLimit, `the plain request ended ${plainRes.ended - t0} ms after the signal`);
  }
  console.log(`shutdown ${mode} (${signal}, --shutdown-timeout ${timeoutS}): ${results.length} streams + 1 plain request ended; ` +
              `last response ${Math.max(...results.map((r) => r.ended), plainRes.ended) - t0} ms after the signal`);
}
done(`shutdown_${mode}`);
