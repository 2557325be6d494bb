// KV cache pressure: many long prompts at once against a KV cache too small for them, so the
// scheduler must preempt; greedy outputs must equal those of an uncontended run.
//   node pressure.mjs uncontended|contended N PROMPT_LEN MAX_TOKENS VOCAB RESULT_JSON
// uncontended: the N prompts one at a time; their token ids are written to RESULT_JSON.
// contended:   the N prompts all at once; each must complete with MAX_TOKENS tokens equal to
//              RESULT_JSON's, osprey_num_preemptions_total must have grown, and afterwards no
//              request runs or waits and no KV block is held. Prints a summary table.
// Prompts are token ids (no tokenizer needed: --load-format dummy works); outputs are read as ids
// through logprobs with return_tokens_as_token_ids.
import fs from 'node:fs';
import { request, check, done, metrics, waitIdle } from './lib.mjs';

const [mode, nArg, lenArg, maxArg, vocabArg, resultPath] = process.argv.slice(2);
const [N, L, M, V] = [nArg, lenArg, maxArg, vocabArg].map(Number);
check(['uncontended', 'contended'].includes(mode) && N > 0 && L > 0 && M > 0 && V > 16 && resultPath,
      'usage: pressure.mjs uncontended|contended N PROMPT_LEN MAX_TOKENS VOCAB RESULT_JSON');

// Prompt i: distinct, deterministic ids away from the low (special) ids.
const kFirstId = 16;
const prompt = (i) => Array.from({ length: L }, (_, j) => kFirstId + ((i * 7919 + j * 104729 + j * j) % (V - kFirstId)));

async function generate(i) {
  const t0 = Date.now();
  const r = await request('POST', '/v1/completions', {
    body: { prompt: prompt(i), max_tokens: M, temperature: 0, ignore_eos: true, logprobs: 0,
            return_tokens_as_token_ids: true },
  });
  const ms = Date.now() - t0;
  if (r.status !== 200) return { ok: false, why: `status ${r.status}: ${r.body.slice(0, 200)}`, ms };
  const c = JSON.parse(r.body).choices[0];
  const ids = c.logprobs.tokens.map((t) => Number(t.slice('token_id:'.length)));
  return { ok: true, ids, finish: c.finish_reason, ms };
}

const before = await metrics();
const t0 = Date.now();
let results;
if (mode === 'uncontended') {
  results = [];
  for (let i = 0; i < N; i++) results.push(await generate(i));
} else {
  results = await Promise.all(Array.from({ length: N }, (_, i) => generate(i)));
}
const wallS = (Date.now() - t0) / 1000;
results.forEach((r, i) => {
  check(r.ok, `request ${i}: ${r.why}`);
  if (r.ok) check(r.ids.length === M && r.finish === 'length', `request ${i}: ${r.ids.length} tokens (${r.finish}), expected ${M}`);
});
const idle = await waitIdle(60000);
check(idle.osprey_num_requests_running === 0 && idle.osprey_num_requests_waiting === 0, 'nothing running or waiting afterwards');
check(idle.osprey_kv_cache_usage_perc === 0, `no KV block held afterwards (usage ${idle.osprey_kv_cache_usage_perc})`);
const preemptions = idle.osprey_num_preemptions_total - (before.osprey_num_preemptions_total || 0);

if (mode === 'uncontended') {
  fs.writeFileSync(resultPath, JSON.stringify({ N, L, M, tokens: results.map((r) => r.ids) }));
  console.log(`pressure uncontended: ${N} prompts of ${L} tokens, ${M} out each, ${wallS.toFixed(1)} s, preemptions ${preemptions}`);
} else {
  const ref = JSON.parse(fs.readFileSync(resultPath, 'utf8'));
  check(ref.N === N && ref.L === L && ref.M === M, 'the uncontended run used the same sizes');
  let equal = 0;
  const diverged = [];
  results.forEach((r, i) => {
    if (!r.ok) return;
    const a = ref.tokens[i];
    const k = r.ids.findIndex((t, j) => t !== a[j]);
    if (k < 0 && r.ids.length === a.length) equal++;
    else diverged.push(`${i}@${k}`);
  });
  check(equal === N, `greedy outputs equal to the uncontended run: ${equal} of ${N} (diverged prompt@token: ${diverged.slice(0, 10).join(' ')})`);
  check(preemptions > 0, `the KV cache forced preemptions (osprey_num_preemptions_total grew by ${preemptions})`);
  const ms = results.filter((r) => r.ok).map((r) => r.ms).sort((x, y) => x - y);
  const rows = [
    ['concurrent requests', N], ['prompt tokens each', L], ['output tokens each', M],
    ['completed', `${results.filter((r) => r.ok).length} of ${N}`],
    ['outputs equal to uncontended', `${equal} of ${N}`],
    ['preemptions', preemptions],
    ['KV cache usage after', `${idle.osprey_kv_cache_usage_perc}`],
    ['wall time (s)', wallS.toFixed(1)],
    ['latency median / max (s)', `${(ms[Math.floor(ms.length / 2)] / 1000).toFixed(1)} / ${(ms.at(-1) / 1000).toFixed(1)}`],
  ];
  console.log('| pressure run | value |\n|---|---|');
  for (const [k, v] of rows) console.log(`| ${k} | ${v} |`);
}
done(`pressure_${mode}`);
