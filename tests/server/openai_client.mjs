// The official `openai` npm client against osprey serve: completions and chat, streaming and not,
// usage, logprobs, errors as the client surfaces them, and the API key.
import OpenAI from 'openai';
import { URL_BASE, API_KEY, check, done, waitIdle } from './lib.mjs';

const client = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0 });
const models = await client.models.list();
const model = models.data[0].id;
check(models.data.length === 1 && typeof model === 'string', 'models.list returns the served model');

// Completions, not streamed.
const c = await client.completions.create({ model, prompt: 'Ann has 12 apples', max_tokens: 7, temperature: 0 });
check(c.object === 'text_completion', 'completion object');
check(c.choices.length === 1 && typeof c.choices[0].text === 'string', 'completion text');
check(['length', 'stop'].includes(c.choices[0].finish_reason), `finish_reason (got ${c.choices[0].finish_reason})`);
const ctoks = c.usage.completion_tokens;
check(ctoks >= 1 && ctoks <= 7 && (ctoks === 7) === (c.choices[0].finish_reason === 'length') &&
      c.usage.prompt_tokens > 0 && c.usage.total_tokens === c.usage.prompt_tokens + ctoks, 'completion usage');

// The same request streamed gives the same text (greedy), chunk by chunk, then usage.
const s = await client.completions.create({ model, prompt: 'Ann has 12 apples', max_tokens: 7, temperature: 0,
                                            stream: true, stream_options: { include_usage: true } });
let text = '', finish = null, usage = null, chunks = 0;
for await (const ch of s) {
  chunks++;
  if (ch.choices.length) {
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  if (ch.usage) usage = ch.usage;
}
check(text === c.choices[0].text, `streamed text equals the non-streamed text (${JSON.stringify(text)} vs ${JSON.stringify(c.choices[0].text)})`);
check(finish === c.choices[0].finish_reason && chunks >= 2, 'stream ends with the same finish_reason');
check(usage && usage.completion_tokens === ctoks && usage.prompt_tokens === c.usage.prompt_tokens, 'include_usage chunk');

// Chat, not streamed, with n = 2 and a seed.
const chat = await client.chat.completions.create({
  model, messages: [{ role: 'system', content: 'You solve arithmetic.' }, { role: 'user', content: 'What is 2 + 3?' }],
  max_tokens: 6, n: 2, seed: 7, temperature: 0.8, logprobs: true, top_logprobs: 3 });
check(chat.object === 'chat.completion', 'chat object');
check(chat.choices.length === 2 && chat.choices[1].index === 1, 'n = 2 choices');
check(chat.choices[0].message.role === 'assistant', 'assistant message');
const lp = chat.choices[0].logprobs.content;
check(Array.isArray(lp) && lp.length >= 1 && lp.length <= 6 &&
      lp.length + chat.choices[1].logprobs.content.length === chat.usage.completion_tokens, 'one logprob entry per token');
check(lp.every((e) => e.top_logprobs.length === 3 && e.logprob <= 0), 'top_logprobs has 3 alternatives, logprobs ≤ 0');
check(lp.every((e) => e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob), 'alternatives sorted');
// Reproducible with the same seed.
const again = await client.chat.completions.create({
  model, messages: [{ role: 'system', content: 'You solve arithmetic.' }, { role: 'user', content: 'What is 2 + 3?' }],
  max_tokens: 6, n: 2, seed: 7, temperature: 0.8 });
check(again.choices[0].message.content === chat.choices[0].message.content &&
      again.choices[1].message.content === chat.choices[1].message.content, 'same seed, same text');

// Chat streamed: a role delta first, content deltas, a finish reason.
const cs = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Count to three.' }],
                                                  max_tokens: 8, temperature: 0, stream: true });
let role = null, content = '', cfinish = null;
for await (const ch of cs) {
  const d = ch.choices[0]?.delta ?? {};
  if (d.role) role = d.role;
  if (d.content) content += d.content;
  if (ch.choices[0]?.finish_reason) cfinish = ch.choices[0].finish_reason;
}
check(role === 'assistant' && ['length', 'stop'].includes(cfinish), 'chat stream role and finish');
const cnon = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Count to three.' }],
                                                   max_tokens: 8, temperature: 0 });
check(content === cnon.choices[0].message.content, 'streamed chat equals non-streamed chat');

// Stop strings cut the text (found in the greedy text itself, so the test cannot be vacuous).
const base = await client.completions.create({ model, prompt: 'Ben had 40 coins', max_tokens: 24, temperature: 0 });
const t = base.choices[0].text;
const stopAt = [...t].length > 6 ? [...t].slice(3, 5).join('') : null;
if (stopAt && !stopAt.includes('\uFFFD')) {
  const cut = await client.completions.create({ model, prompt: 'Ben had 40 coins', max_tokens: 24, temperature: 0, stop: [stopAt] });
  check(cut.choices[0].finish_reason === 'stop' && cut.choices[0].text === t.slice(0, t.indexOf(stopAt)),
        `stop string cuts the text before ${JSON.stringify(stopAt)}`);
}

// Errors reach the client as typed exceptions with the server's message.
async function expectError(fn, status, fragment, what) {
  try {
    await fn();
    check(false, `${what}: no error`);
  } catch (e) {
    check(e.status === status, `${what}: status ${e.status}, expected ${status}`);
    check(String(e.message).includes(fragment), `${what}: message ${JSON.stringify(e.message)} lacks ${JSON.stringify(fragment)}`);
  }
}
await expectError(() => client.completions.create({ model: 'nope', prompt: 'x' }), 404, 'does not exist', 'unknown model');
await expectError(() => client.completions.create({ model, prompt: 'x', temperature: 5 }), 400, 'temperature', 'temperature out of range');
await expectError(() => client.chat.completions.create({ model, messages: [] }), 400, 'messages', 'empty messages');
const wrongKey = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: 'wrong', maxRetries: 0 });
await expectError(() => wrongKey.models.list(), 401, 'API key', 'wrong API key');

const idle = await waitIdle();
check(idle.osprey_kv_cache_usage_perc === 0, 'no KV block held afterwards');
done('openai_client');
