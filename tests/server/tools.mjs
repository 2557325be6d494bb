// Tool calls and reasoning through the official `openai` npm client against osprey serve.
// Part 1 (any model): the request checks of tools, tool_choice and tool messages, as the client
// surfaces them. Part 2 needs the bundled arithmetic model trained with the calculator tool and
// thinking mode (tools/train_arith.py; its train_report.json lists "chat_modes"): a full tool
// round trip, streamed and not, tool_choice none / required / named, and a thinking-mode answer
// with its reasoning. Without that model part 2 is skipped (exit 77: ctest reports SKIPPED).
import { readFileSync, existsSync } from 'node:fs';
import OpenAI from 'openai';
import { URL_BASE, API_KEY, check, done } from './lib.mjs';

const client = new OpenAI({ baseURL: `${URL_BASE}/v1`, apiKey: API_KEY, maxRetries: 0 });
const model = (await client.models.list()).data[0].id;

// The tool the model was trained with (tools/arith/generate.py CALCULATOR_TOOL, same key order:
// the schema's text is part of the prompt).
const CALCULATOR = {
  type: 'function',
  function: {
    name: 'calculator',
    description: 'Evaluates an arithmetic expression of whole numbers with + - * / and parentheses, and returns its value.',
    parameters: {
      type: 'object',
      properties: { expression: { type: 'string', description: 'The expression, e.g. (12 + 5) * 3' } },
      required: ['expression'],
    },
  },
};

async function status400(params, what, needle) {
  try {
    await client.chat.completions.create({ model, max_tokens: 4, ...params });
    check(false, `${what}: expected a 400`);
  } catch (e) {
    check(e.status === 400 && (!needle || String(e.message).includes(needle)),
          `${what}: 400 naming ${needle} (got ${e.status} ${e.message})`);
  }
}

const user = [{ role: 'user', content: 'What is 2 + 2?' }];
await status400({ messages: user, tools: [{ type: 'function', function: { name: 'bad name!' } }] },
                'invalid function name', 'tools[0].function.name');
await status400({ messages: user, tools: [CALCULATOR], tool_choice: { type: 'function', function: { name: 'nope' } } },
                'tool_choice naming an unknown function', 'tool_choice');
await status400({ messages: user, tool_choice: 'required' }, 'tool_choice required without tools', 'tool_choice');
await status400({ messages: [...user, { role: 'tool', content: '4' }] }, 'tool message without tool_call_id', 'tool_call_id');
await status400({ messages: [...user, { role: 'assistant', content: null,
                  tool_calls: [{ id: 'c1', type: 'function', function: { name: 'calculator', arguments: '{not json' } }] }] },
                'tool call arguments that are not JSON', 'arguments');

const report = new URL('../../models/osprey-arith/train_report.json', import.meta.url);
const modes = existsSync(report) ? JSON.parse(readFileSync(report, 'utf8')).chat_modes || [] : [];
if (!modes.includes('tool') || !modes.includes('thinking')) {
  done('tools (request checks)');
  console.log('tools: the bundled model was not trained with the calculator tool and thinking mode (train_report.json chat_modes): tool round trips SKIPPED');
  process.exit(77);
}

// The calculator: whole numbers, + - * /, parentheses (generate.py calculate).
function calculate(expr) {
  const t = expr.match(/\d+|[-+*/()]|\S/g) || [];
  let i = 0;
  const atom = () => {
    const x = t[i++];
    if (x === '(') { const v = add(); if (t[i++] !== ')') throw new Error('missing )'); return v; }
    if (/^\d+$/.test(x || '')) return Number(x);
    throw new Error(`unexpected ${x}`);
  };
  const mul = () => { let v = atom(); while (t[i] === '*' || t[i] === '/') { const op = t[i++]; const r = atom(); v = op === '*' ? v * r : v / r; } return v; };
  const add = () => { let v = mul(); while (t[i] === '+' || t[i] === '-') { const op = t[i++]; const r = mul(); v = op === '+' ? v + r : v - r; } return v; };
  const v = add();
  if (i !== t.length) throw new Error('trailing input');
  return String(v);
}

// A whole DSML call is ~180 tokens in the bundled model's digit-and-character tokenizer (its
// markup alone ~150); 300 leaves room without letting a runaway answer pass for a call.
const CALL_TOKENS = 300;
const problems = readFileSync(new URL('../data/arith/test.jsonl', import.meta.url), 'utf8')
  .trim().split('\n').slice(0, 8).map((l) => JSON.parse(l));
const lastNumber = (s) => (String(s).match(/-?\d+/g) || []).pop();

let answered = 0;
for (const p of problems) {
  const messages = [{ role: 'user', content: p.question }];
  const r1 = await client.chat.completions.create({ model, messages, tools: [CALCULATOR], temperature: 0, max_tokens: CALL_TOKENS });
  const m1 = r1.choices[0].message;
  check(r1.choices[0].finish_reason === 'tool_calls', `${p.id}: finish_reason tool_calls (got ${r1.choices[0].finish_reason})`);
  check(m1.tool_calls?.length === 1 && m1.tool_calls[0].type === 'function' && m1.tool_calls[0].function.name === 'calculator' &&
        typeof m1.tool_calls[0].id === 'string' && m1.tool_calls[0].id.length > 0, `${p.id}: one calculator call with an id`);
  if (!m1.tool_calls?.length) continue;
  const args = JSON.parse(m1.tool_calls[0].function.arguments);
  check(typeof args.expression === 'string', `${p.id}: arguments {"expression": ...}`);
  let result = 'error';
  try { result = calculate(args.expression); } catch { /* the model's expression did not parse */ }

  // The same request streamed: id and name first, then the arguments; the same call.
  const s = await client.chat.completions.create({ model, messages, tools: [CALCULATOR], temperature: 0, max_tokens: CALL_TOKENS, stream: true });
  const calls = [];
  let streamFinish = null, argsBeforeName = false;
  for await (const ch of s) {
    const c = ch.choices[0];
    if (!c) continue;
    for (const d of c.delta.tool_calls || []) {
      if (!calls[d.index]) calls[d.index] = { id: '', name: '', arguments: '' };
      const acc = calls[d.index];
      if (d.id) acc.id = d.id;
      if (d.function?.name) acc.name += d.function.name;
      if (d.function?.arguments) { if (!acc.name) argsBeforeName = true; acc.arguments += d.function.arguments; }
    }
    if (c.finish_reason) streamFinish = c.finish_reason;
  }
  check(streamFinish === 'tool_calls' && calls.length === 1 && calls[0].name === 'calculator' && !argsBeforeName &&
        calls[0].id && calls[0].arguments === m1.tool_calls[0].function.arguments,
        `${p.id}: the streamed call equals the non-streamed one (${JSON.stringify(calls)})`);

  // The tool's answer goes back; the model finishes with it.
  const r2 = await client.chat.completions.create({
    model, tools: [CALCULATOR], temperature: 0, max_tokens: 40,
    messages: [...messages, m1, { role: 'tool', tool_call_id: m1.tool_calls[0].id, content: result }],
  });
  const m2 = r2.choices[0].message;
  check(r2.choices[0].finish_reason === 'stop' && !m2.tool_calls && typeof m2.content === 'string',
        `${p.id}: the reply after the tool result is content`);
  if (result === String(p.answer) && lastNumber(m2.content) === String(p.answer)) answered++;
}
// A small trained model is not perfect: most round trips must end in the right answer.
check(answered >= 6, `calculator round trips with the right final answer: ${answered}/${problems.length} (need 6)`);

const q = [{ role: 'user', content: problems[0].question }];
const none = await client.chat.completions.create({ model, messages: q, tools: [CALCULATOR], tool_choice: 'none', temperature: 0, max_tokens: CALL_TOKENS });
check(!none.choices[0].message.tool_calls && none.choices[0].finish_reason !== 'tool_calls' &&
      typeof none.choices[0].message.content === 'string', 'tool_choice none: no tool_calls');
for (const choice of ['required', { type: 'function', function: { name: 'calculator' } }]) {
  const r = await client.chat.completions.create({ model, messages: q, tools: [CALCULATOR], tool_choice: choice, temperature: 0, max_tokens: CALL_TOKENS });
  const tc = r.choices[0].message.tool_calls;
  check(tc?.length >= 1 && tc[0].function.name === 'calculator' && JSON.parse(tc[0].function.arguments).expression,
        `tool_choice ${JSON.stringify(choice)}: a calculator call`);
}

// Thinking mode: the steps are reasoning_content, the final sentence is content.
let thoughtful = 0;
for (const p of problems) {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: p.question }], temperature: 0,
                                                   max_tokens: 200, chat_template_kwargs: { thinking: true } });
  const m = r.choices[0].message;
  check(typeof m.reasoning_content === 'string' && m.reasoning_content.includes(' = ') && !m.content.includes('</think>'),
        `${p.id}: thinking mode gives reasoning_content with the steps`);
  if (lastNumber(m.content) === String(p.answer) && /The answer is/.test(m.content)) thoughtful++;
}
check(thoughtful >= 6, `thinking-mode answers right: ${thoughtful}/${problems.length} (need 6)`);
console.log(`tools: calculator round trips right ${answered}/${problems.length}, thinking-mode answers right ${thoughtful}/${problems.length}`);
done('tools');
