// Every numeric field of a request is bounded: a value outside its range is refused with a 400
// whose message names the field, its range and the value sent; nothing is clamped. Boundary
// values inside the range are accepted. Server: --max-model-len 512 (scripts/server_test.sh), the
// bundled model (vocabulary size read from /tokenize's model: VOCAB below).
import { request, check, done, waitIdle } from './lib.mjs';

const VOCAB = 512; // models/osprey-arith/config.json vocab_size
const ok = { prompt: '1+2=', max_tokens: 2 };
const chat = { messages: [{ role: 'user', content: '1+2=' }], max_tokens: 2 };
const C = '/v1/completions';
const H = '/v1/chat/completions';
// [field, path, body (object or a raw JSON string), message fragment]
const refused = [
  ['n 0', C, { ...ok, n: 0 }, "'n' must be between 1 and 16, got 0"],
  ['n 17', C, { ...ok, n: 17 }, "'n' must be between 1 and 16, got 17"],
  ['n times prompts', C, { ...ok, prompt: ['a', 'b', 'c', 'd', 'e'], n: 4 }, "'n' times the number of prompts exceeds 16"],
  ['best_of differs from n', C, { ...ok, n: 2, best_of: 3 }, "'best_of' must equal n"],
  ['max_tokens 0', C, { ...ok, max_tokens: 0 }, "'max_tokens' must be at least 1, got 0"],
  ['max_tokens past the context', C, { ...ok, max_tokens: 512 }, 'maximum context length is 512 tokens'],
  ['max_tokens int64 max', C, `{"prompt": "1+2=", "max_tokens": 9223372036854775807}`, 'you requested more than 2147483647'],
  ['max_tokens above int64', C, `{"prompt": "1+2=", "max_tokens": 18446744073709551615}`, "'max_tokens' must be an integer in [-9223372036854775808, 9223372036854775807], got 18446744073709551615"],
  ['max_completion_tokens 0', H, { ...chat, max_tokens: undefined, max_completion_tokens: 0 }, "'max_completion_tokens' must be at least 1, got 0"],
  ['logprobs -1', C, { ...ok, logprobs: -1 }, "'logprobs' must be between 0 and 20, got -1"],
  ['logprobs 21', C, { ...ok, logprobs: 21 }, "'logprobs' must be between 0 and 20, got 21"],
  ['top_logprobs 21', H, { ...chat, logprobs: true, top_logprobs: 21 }, "'top_logprobs' must be between 0 and 20, got 21"],
  ['top_logprobs -1', H, { ...chat, logprobs: true, top_logprobs: -1 }, "'top_logprobs' must be between 0 and 20, got -1"],
  ['top_k -2', C, { ...ok, top_k: -2 }, "'top_k' must be -1 or 0 (off) or in [1, 512] (the vocabulary size), got -2"],
  ['top_k past the vocabulary', C, { ...ok, top_k: VOCAB + 1 }, 'got 513'],
  ['top_k huge', C, { ...ok, top_k: 1e15 }, 'got 1000000000000000'],
  ['temperature -0.1', C, { ...ok, temperature: -0.1 }, "'temperature' must be a number in [0.0, 2.0], got -0.1"],
  ['temperature 2.5', C, { ...ok, temperature: 2.5 }, 'got 2.5'],
  ['temperature past float', C, `{"prompt": "1+2=", "temperature": 1e300}`, "'temperature' must be a number in [0.0, 2.0], got 1e+300"],
  ['top_p 0', C, { ...ok, top_p: 0 }, "'top_p' must be a number in (0.0, 1.0], got 0"],
  ['top_p 1.01', C, { ...ok, top_p: 1.01 }, 'got 1.01'],
  ['min_p -0.5', C, { ...ok, min_p: -0.5 }, "'min_p' must be a number in [0.0, 1.0], got -0.5"],
  ['min_p 1.5', C, { ...ok, min_p: 1.5 }, "'min_p'"],
  ['presence_penalty -2.1', C, { ...ok, presence_penalty: -2.1 }, "'presence_penalty' must be a number in [-2.0, 2.0], got -2.1"],
  ['presence_penalty 2.1', C, { ...ok, presence_penalty: 2.1 }, "'presence_penalty'"],
  ['frequency_penalty 3', C, { ...ok, frequency_penalty: 3 }, "'frequency_penalty' must be a number in [-2.0, 2.0], got 3"],
  ['frequency_penalty -3', H, { ...chat, frequency_penalty: -3 }, "'frequency_penalty'"],
  ['repetition_penalty 0', C, { ...ok, repetition_penalty: 0 }, "'repetition_penalty' must be a number in (0.0, 2.0], got 0"],
  ['repetition_penalty 2.5', C, { ...ok, repetition_penalty: 2.5 }, "'repetition_penalty'"],
  ['min_tokens -1', C, { ...ok, min_tokens: -1 }, "'min_tokens' must be an integer in [0, 1073741824], got -1"],
  ['min_tokens above max_tokens', C, { ...ok, min_tokens: 3 }, 'min_tokens must be in [0, max_tokens=2], got 3'],
  ['seed above int64', C, `{"prompt": "1+2=", "seed": 9223372036854775808}`, "'seed' must be an integer in [-9223372036854775808, 9223372036854775807], got 9223372036854775808"],
  ['seed float', C, { ...ok, seed: 1.5 }, "'seed' must be an integer"],
  ['stop 17 strings', C, { ...ok, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }, "'stop' may hold at most 16 strings, got 17"],
  ['stop empty string', C, { ...ok, stop: ['x', ''] }, "'stop' holds an empty string (at index 1)"],
  ['stop_token_ids 65 ids', C, { ...ok, stop_token_ids: Array.from({ length: 65 }, () => 1) }, "'stop_token_ids' may hold at most 64 ids, got 65"],
  ['stop_token_ids past the vocabulary', C, { ...ok, stop_token_ids: [1, VOCAB] }, "'stop_token_ids' holds 512 (at index 1), outside the vocabulary [0, 512)"],
  ['stop_token_ids negative', C, { ...ok, stop_token_ids: [-1] }, "'stop_token_ids' holds -1 (at index 0)"],
  ['prompt id past the vocabulary', C, { ...ok, prompt: [1, VOCAB] }, "'prompt' has token id 512 outside the vocabulary [0, 512)"],
  ['prompt id negative', C, { ...ok, prompt: [-3, 4] }, "'prompt' has token id -3 outside the vocabulary"],
  ['prompt id in a batch', C, { ...ok, prompt: [[1, 2], [3, 70000]] }, "'prompt' has token id 70000"],
  ['prompts 17', C, { ...ok, prompt: Array.from({ length: 17 }, () => 'x') }, "'prompt' has more than 16 prompts"],
  // Found by openai_request_fuzz (corpus crash_number_overflows_double): was a 500.
  ['number beyond a double', C, '{"prompt": "x", "temperature": 1e999}', 'the request body is not valid JSON'],
  ['JSON nested too deep', C, '{"prompt": ' + '['.repeat(100) + ']'.repeat(100) + '}', 'nests JSON deeper than 64 levels'],
];
// In range, at the edges: accepted (200).
const accepted = [
  ['n 16', C, { ...ok, n: 16 }],
  ['temperature 0 and 2', C, { ...ok, temperature: 2 }],
  ['top_k -1, top_p 1, min_p 1', C, { ...ok, top_k: -1, top_p: 1, min_p: 1 }],
  ['top_k = vocab', C, { ...ok, top_k: VOCAB }],
  ['penalties at +-2', C, { ...ok, presence_penalty: -2, frequency_penalty: 2, repetition_penalty: 2 }],
  ['logprobs 20', C, { ...ok, logprobs: 20 }],
  ['top_logprobs 20', H, { ...chat, logprobs: true, top_logprobs: 20 }],
  ['seed int64 min', C, `{"prompt": "1+2=", "max_tokens": 2, "seed": -9223372036854775808}`],
  ['stop 16 strings, stop_token_ids 64 ids', C, { ...ok, stop: Array.from({ length: 16 }, (_, i) => `s${i}`), stop_token_ids: Array.from({ length: 64 }, (_, i) => i) }],
  ['max_tokens to the context end', C, { prompt: [5, 6, 7], max_tokens: 509, temperature: 0 }],
];

for (const [name, path, body, fragment] of refused) {
  const raw = typeof body === 'string';
  const r = await request('POST', path, { body: raw ? body : body, raw });
  let msg = '';
  try { msg = JSON.parse(r.body).error.message; } catch { msg = r.body; }
  check(r.status === 400, `${name}: status ${r.status}, expected 400 (${msg.slice(0, 160)})`);
  check(msg.includes(fragment), `${name}: message ${JSON.stringify(msg)} lacks ${JSON.stringify(fragment)}`);
}
for (const [name, path, body] of accepted) {
  const raw = typeof body === 'string';
  const r = await request('POST', path, { body, raw });
  check(r.status === 200, `${name}: status ${r.status}, expected 200 (${r.body.slice(0, 200)})`);
}
const m = await waitIdle();
check(m.osprey_kv_cache_usage_perc === 0, 'no KV block held');
console.log(`numeric_bounds: ${refused.length} refused, ${accepted.length} accepted at the edges`);
done('numeric_bounds');
