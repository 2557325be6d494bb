#!/usr/bin/env python3
"""Single-thread encode throughput of Hugging Face `tokenizers` on the same text and in the same
two modes as bench_tokenizer (see tokenizer_bench.cpp): every "\\n\\n"-separated document encoded
with its own `encode` call, then the whole text in one call. Run by bench/tokenizer_vs_hf.sh.

    tokenizer_vs_hf.py TOKENIZER_JSON TEXT_FILE [REPEAT]
"""
import os
import sys
import time

# One thread: set before tokenizers is imported (encode_batch would use a thread pool; we do not
# call it, and this keeps any internal parallelism off too).
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def best_of(repeat, run):
    best = (float("inf"), 0)
    for _ in range(repeat):
        t0 = time.perf_counter()
        tokens = run()
        seconds = time.perf_counter() - t0
        if seconds < best[0]:
            best = (seconds, tokens)
    return best


def report(mode, nbytes, seconds, tokens):
    print(f"hf     {mode:<9} {nbytes / 1e6 / seconds:8.2f} MB/s  {tokens / seconds:10.0f} tokens/s"
          f"  {tokens} tokens  {seconds:.3f} s")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, text_path = sys.argv[1], sys.argv[2]
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    load = time.perf_counter() - t0
    with open(text_path, encoding="utf-8", newline="") as f:  # newline="": keep \r\n as is
        text = f.read()
    docs = [d for d in text.split("\n\n") if d]
    doc_bytes = sum(len(d.encode("utf-8")) for d in docs)
    print(f"tokenizers {tokenizers.__version__} (loaded in {load:.2f} s); text "
          f"{len(text.encode('utf-8'))} bytes, {len(docs)} documents")

    def per_doc():
        return sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)

    seconds, tokens = best_of(repeat, per_doc)
    report("documents", doc_bytes, seconds, tokens)
    seconds, tokens = best_of(repeat, lambda: len(tok.encode(text, add_special_tokens=False).ids))
    report("whole", len(text.encode("utf-8")), seconds, tokens)


if __name__ == "__main__":
    main()
