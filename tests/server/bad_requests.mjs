// Bad requests: each kind gets the right status and a message naming what was wrong, and the
// server keeps serving. Server started with --api-key test-key --max-request-bytes 65536
// --max-model-len 512.
import { request, check, done, waitIdle } from './lib.mjs';

const ok = { prompt: 'Ann has 3 apples', max_tokens: 4 };
const chatOk = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 };
const long = Array.from({ length: 600 }, (_, i) => 10 + (i % 200));
const cases = [
  // [name, method, path, body (object, or {raw}), expected status, message fragment, options]
  ['malformed JSON', 'POST', '/v1/completions', { raw: '{"prompt": "x",' }, 400, 'not valid JSON'],
  ['body not an object', 'POST', '/v1/completions', [1, 2], 400, 'JSON object'],
  ['empty body', 'POST', '/v1/completions', { raw: '' }, 400, 'empty'],
  ['invalid UTF-8', 'POST', '/v1/completions', { raw: Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]) }, 400, 'UTF-8'],
  ['missing prompt', 'POST', '/v1/completions', { max_tokens: 3 }, 400, "'prompt' is required"],
  ['prompt wrong type', 'POST', '/v1/completions', { prompt: 42 }, 400, "'prompt'"],
  ['empty prompt', 'POST', '/v1/completions', { prompt: '' }, 400, "'prompt' is empty"],
  ['prompt ids outside vocab', 'POST', '/v1/completions', { prompt: [1, 2, 99999] }, 400, 'outside the vocabulary'],
  ['negative max_tokens', 'POST', '/v1/completions', { ...ok, max_tokens: -5 }, 400, "'max_tokens' must be at least 1"],
  ['max_tokens wrong type', 'POST', '/v1/completions', { ...ok, max_tokens: '10' }, 400, "'max_tokens' must be an integer"],
  ['temperature too high', 'POST', '/v1/completions', { ...ok, temperature: 3.5 }, 400, 'temperature'],
  ['temperature wrong type', 'POST', '/v1/completions', { ...ok, temperature: 'hot' }, 400, "'temperature' must be a number"],
  ['top_p zero', 'POST', '/v1/completions', { ...ok, top_p: 0 }, 400, 'top_p'],
  ['top_p above one', 'POST', '/v1/completions', { ...ok, top_p: 1.5 }, 400, 'top_p'],
  ['top_k negative', 'POST', '/v1/completions', { ...ok, top_k: -5 }, 400, 'top_k'],
  ['presence_penalty out of range', 'POST', '/v1/completions', { ...ok, presence_penalty: 5 }, 400, 'presence_penalty'],
  ['frequency_penalty wrong type', 'POST', '/v1/completions', { ...ok, frequency_penalty: [1] }, 400, "'frequency_penalty' must be a number"],
  ['min_tokens above max_tokens', 'POST', '/v1/completions', { ...ok, min_tokens: 10 }, 400, 'min_tokens'],
  ['unknown field', 'POST', '/v1/completions', { ...ok, frobnicate: true }, 400, "unrecognized request argument 'frobnicate'"],
  ['n zero', 'POST', '/v1/completions', { ...ok, n: 0 }, 400, "'n' must be between 1"],
  ['n too large', 'POST', '/v1/completions', { ...ok, n: 100 }, 400, "'n' must be between 1"],
  ['logprobs too many', 'POST', '/v1/completions', { ...ok, logprobs: 50 }, 400, "'logprobs' must be between 0"],
  ['stop list too long', 'POST', '/v1/completions', { ...ok, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }, 400, 'stop'],
  ['stop wrong type', 'POST', '/v1/completions', { ...ok, stop: [1, 2] }, 400, "'stop' must be a string or a list of strings"],
  ['seed wrong type', 'POST', '/v1/completions', { ...ok, seed: 'abc' }, 400, "'seed' must be an integer"],
  ['stream_options without stream', 'POST', '/v1/completions', { ...ok, stream_options: { include_usage: true } }, 400, "'stream_options' is only allowed"],
  ['echo with stream', 'POST', '/v1/completions', { ...ok, echo: true, stream: true }, 400, "'echo'"],
  ['logit_bias', 'POST', '/v1/completions', { ...ok, logit_bias: { 5: 10 } }, 400, 'logit_bias'],
  ['suffix', 'POST', '/v1/completions', { ...ok, suffix: 'end' }, 400, 'suffix'],
  ['prompt longer than max_model_len', 'POST', '/v1/completions', { prompt: long, max_tokens: 4 }, 400, "maximum context length is 512 tokens. However, your prompt has 600 tokens"],
  ['prompt + max_tokens beyond max_model_len', 'POST', '/v1/completions', { prompt: long.slice(0, 500), max_tokens: 100 }, 400, 'you requested 600 tokens (500 in the prompt, 100 in the completion)'],
  ['unknown model', 'POST', '/v1/completions', { ...ok, model: 'gpt-9' }, 404, "The model 'gpt-9' does not exist"],
  ['empty messages', 'POST', '/v1/chat/completions', { messages: [] }, 400, "'messages' must not be empty"],
  ['messages not a list', 'POST', '/v1/chat/completions', { messages: 'hi' }, 400, "'messages' must be a list"],
  ['missing messages', 'POST', '/v1/chat/completions', { max_tokens: 3 }, 400, "'messages' is required"],
  ['message without role', 'POST', '/v1/chat/completions', { messages: [{ content: 'hi' }] }, 400, "messages[0].role' is required"],
  ['message with a bad role', 'POST', '/v1/chat/completions', { messages: [{ role: 'wizard', content: 'hi' }] }, 400, "is 'wizard'"],
  ['message content wrong type', 'POST', '/v1/chat/completions', { messages: [{ role: 'user', content: 7 }] }, 400, "messages[0].content' must be a string"],
  ['image content part', 'POST', '/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400, 'parts must be'],
  ['top_logprobs without logprobs', 'POST', '/v1/chat/completions', { ...chatOk, top_logprobs: 2 }, 400, "'top_logprobs' requires 'logprobs'"],
  ['tool with a bad name', 'POST', '/v1/chat/completions', { ...chatOk, tools: [{ type: 'function', function: { name: 'f g' } }] }, 400, "tools[0].function.name'"],
  ['tool_choice without tools', 'POST', '/v1/chat/completions', { ...chatOk, tool_choice: 'required' }, 400, "'tool_choice' is 'required'"],
  ['tool message without its call', 'POST', '/v1/chat/completions', { ...chatOk, messages: [{ role: 'user', content: 'hi' }, { role: 'tool', tool_call_id: 'x', content: '4' }] }, 400, 'must follow an assistant message'],
  ['response_format json', 'POST', '/v1/chat/completions', { ...chatOk, response_format: { type: 'json_object' } }, 400, 'response_format'],
  ['max_completion_tokens negative', 'POST', '/v1/chat/completions', { ...chatOk, max_completion_tokens: 0 }, 400, "'max_completion_tokens' must be at least 1"],
  ['body over the size limit', 'POST', '/v1/completions', { raw: JSON.stringify({ prompt: 'x'.repeat(70000) }) }, 413, 'larger than 65536 bytes'],
  ['missing API key', 'POST', '/v1/completions', ok, 401, 'missing API key', { auth: false }],
  ['wrong API key', 'POST', '/v1/completions', ok, 401, 'incorrect API key', { headers: { Authorization: 'Bearer nope' } }],
  ['GET on a POST route', 'GET', '/v1/completions', undefined, 405, 'use POST'],
  ['unknown route', 'GET', '/v1/engines', undefined, 404, 'no route /v1/engines'],
  ['tokenize without prompt', 'POST', '/tokenize', { text: 'x' }, 400, 'text'],
  ['detokenize unknown id', 'POST', '/detokenize', { tokens: [1, 100000] }, 400, 'token id 100000 is not in the vocabulary'],
];

check(cases.length >= 30, `at least 30 kinds (${cases.length})`);
for (const [name, method, path, body, status, fragment, opts = {}] of cases) {
  const raw = body && Object.prototype.hasOwnProperty.call(body, 'raw') && Object.keys(body).length === 1;
  const r = await request(method, path, { body: raw ? body.raw : body, raw, ...opts });
  check(r.status === status, `${name}: status ${r.status}, expected ${status}: ${r.body.slice(0, 200)}`);
  let parsed = null;
  try { parsed = JSON.parse(r.body); } catch { /* checked below */ }
  check(parsed && parsed.error && typeof parsed.error.message === 'string', `${name}: an OpenAI error object (${r.body.slice(0, 120)})`);
  check(parsed && parsed.error && parsed.error.message.includes(fragment),
        `${name}: message ${JSON.stringify(parsed?.error?.message)} lacks ${JSON.stringify(fragment)}`);
  // And the server still answers a good request after each bad one.
  const good = await request('POST', '/v1/completions', { body: ok });
  check(good.status === 200, `${name}: the next good request got ${good.status}`);
}
const good = await request('POST', '/v1/chat/completions', { body: chatOk });
check(good.status === 200 && JSON.parse(good.body).choices.length === 1, 'chat still served at the end');
const m = await waitIdle();
check(m.osprey_kv_cache_usage_perc === 0, 'no KV block held');
check(m.osprey_request_failure_total >= cases.length - 1, 'failures counted in /metrics');
done('bad_requests');
