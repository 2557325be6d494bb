// Renders deterministic conversations with the reference implementation's chat templates
// (@lenml/tokenizers runs the Jinja templates as transformers does) and writes one JSON line per
// case: {"category", "format", "thinking", "add_generation_prompt", "messages", "text", "ids"}.
// Run from the repository root:
//
//   node tools/tokenizer/reference_chat.mjs PACKAGE COUNT OUT.jsonl V31_TEMPLATE.jinja
//
// Formats: deepseek-v3 uses the template in the package's tokenizer_config.json; deepseek-v3.1
// uses DeepSeek-V3.1's template (a copy in tests/tokenizer/data), with thinking off and on; then
// COUNT/3 conversations with tool calls and tool results in both.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { generateCorpus, mulberry32 } from "./corpus.mjs";

const [pkg, countArg, outPath, v31Path] = process.argv.slice(2);
if (!pkg || !countArg || !outPath || !v31Path) {
  console.error("usage: reference_chat.mjs PACKAGE COUNT OUT.jsonl V31_TEMPLATE.jinja");
  process.exit(2);
}
const require = createRequire(path.join(process.cwd(), "noop.js"));
const { fromPreTrained } = require(pkg);
const tokenizer = fromPreTrained();
// The reference's Jinja engine has no str.split, so the template's one use of it (dropping an
// earlier answer's reasoning up to the first </think>) is done here on the messages instead.
const SPLIT_STATEMENT = "{%- if '</think>' in content -%}\n        {%- set content = content.split('</think>', 1)[1] -%}\n      {%- endif -%}";
const v31Source = readFileSync(v31Path, "utf8");
if (!v31Source.includes(SPLIT_STATEMENT)) throw new Error("unexpected V3.1 template: split statement not found");
const v31Template = v31Source.replace(SPLIT_STATEMENT, "");
const dropReasoning = (messages) => messages.map((m) => {
  const at = m.content.indexOf("</think>");
  return m.role === "assistant" && at >= 0 ? { ...m, content: m.content.slice(at + "</think>".length) } : m;
});

const count = Number(countArg);
const rand = mulberry32(4242);
const texts = generateCorpus(count * 4, 99).map((x) => x.text);
let next = 0;
const content = () => {
  const t = texts[next++ % texts.length];
  return rand() < 0.15 ? `reasoning ${t.slice(0, 20)}</think>${t}` : t;
};

const lines = [];
for (let i = 0; i < count; ++i) {
  const messages = [];
  if (rand() < 0.5) messages.push({ role: "system", content: content() });
  const turns = 1 + Math.floor(rand() * 5);
  let role = "user";
  for (let t = 0; t < turns; ++t) {
    messages.push({ role, content: content() });
    const r = rand();
    role = r < 0.8 ? (role === "user" ? "assistant" : "user") : r < 0.9 ? role : "system";
  }
  const add_generation_prompt = rand() < 0.7;
  const variants = [
    { format: "deepseek-v3", thinking: false, options: {}, prepare: (m) => m },
    { format: "deepseek-v3.1", thinking: false, options: { chat_template: v31Template, thinking: false }, prepare: dropReasoning },
    { format: "deepseek-v3.1", thinking: true, options: { chat_template: v31Template, thinking: true }, prepare: dropReasoning },
  ];
  const v = variants[i % variants.length];
  const text = tokenizer.apply_chat_template(v.prepare(messages), { ...v.options, add_generation_prompt, tokenize: false });
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  lines.push(JSON.stringify({ category: `chat-${v.format}${v.thinking ? "-thinking" : ""}`, format: v.format,
    thinking: v.thinking, add_generation_prompt, messages, text, ids }));
}
// Tool conversations (a third as many): assistant tool_calls (content null, or text for V3.1),
// tool results, answers, more rounds. V3.1's template drops an answer's reasoning only when the
// answer does not follow tool results, and never in a message with tool_calls (its content is
// written as it is), so dropReasoning is applied to the other answers only.
const dropReasoningV31 = (messages) => messages.map((m, i) => {
  if (m.role !== "assistant" || m.content === null || m.tool_calls || (i > 0 && messages[i - 1].role === "tool")) return m;
  const at = m.content.indexOf("</think>");
  return at >= 0 ? { ...m, content: m.content.slice(at + "</think>".length) } : m;
});
const names = ["get_weather", "calculator", "search_web", "lookup"];
const argsOf = () => JSON.stringify(rand() < 0.5
  ? { expression: texts[next++ % texts.length].slice(0, 30) }
  : { city: texts[next++ % texts.length].slice(0, 12), days: Math.floor(rand() * 9), ok: rand() < 0.5 });
const toolCount = Math.max(1, Math.floor(count / 3));
for (let i = 0; i < toolCount; ++i) {
  const v31 = i % 3 !== 0;
  const thinking = v31 && i % 3 === 2;
  const messages = [];
  if (rand() < 0.5) messages.push({ role: "system", content: content() });
  const rounds = 1 + Math.floor(rand() * 2);
  for (let r = 0; r < rounds; ++r) {
    messages.push({ role: "user", content: content() });
    const calls = [];
    const n = 1 + Math.floor(rand() * 3);
    for (let c = 0; c < n; ++c)
      calls.push({ id: `call_${i}_${r}_${c}`, type: "function",
                   function: { name: names[Math.floor(rand() * names.length)], arguments: argsOf() } });
    messages.push({ role: "assistant", content: v31 && rand() < 0.3 ? content() : null, tool_calls: calls });
    for (const c of calls) messages.push({ role: "tool", tool_call_id: c.id, content: content() });
    if (r + 1 < rounds || rand() < 0.5) messages.push({ role: "assistant", content: content() });
  }
  const add_generation_prompt = rand() < 0.7;
  const format = v31 ? "deepseek-v3.1" : "deepseek-v3";
  const options = v31 ? { chat_template: v31Template, thinking } : {};
  const prepared = v31 ? dropReasoningV31(messages) : messages;
  const text = tokenizer.apply_chat_template(prepared, { ...options, add_generation_prompt, tokenize: false });
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  lines.push(JSON.stringify({ category: `chat-tools-${format}${thinking ? "-thinking" : ""}`, format,
    thinking, add_generation_prompt, messages, text, ids }));
}
writeFileSync(outPath, lines.join("\n") + "\n");
console.log(`reference_chat: ${count} + ${toolCount} (tools) conversations rendered with ${pkg} -> ${outPath}`);
