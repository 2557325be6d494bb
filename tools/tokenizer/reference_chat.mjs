// Renders deterministic conversations with the reference implementation's chat templates
// (@lenml/tokenizers runs the Jinja templates as transformers does) and writes one JSON line per
// case: {"category", "format", "thinking", "add_generation_prompt", "messages", "text", "ids"}.
// Run from the repository root:
//
//   node tools/tokenizer/reference_chat.mjs PACKAGE COUNT OUT.jsonl V31_TEMPLATE.jinja
//
// Formats: deepseek-v3 uses the template in the package's tokenizer_config.json; deepseek-v3.1
// uses DeepSeek-V3.1's template (a copy in tests/tokenizer/data), with thinking off and on.
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
writeFileSync(outPath, lines.join("\n") + "\n");
console.log(`reference_chat: ${count} conversations rendered with ${pkg} -> ${outPath}`);
