#!/usr/bin/env python3
"""Trains a small byte-level BPE tokenizer.json (Hugging Face format) for osprey's bundled model.

Pure Python (no packages): GPT-2 style ByteLevel pre-tokenization (use_regex), merges learned by
pair counts over a deterministic corpus of short arithmetic word problems, DeepSeek's special
tokens first (bos 0, eos 1, <｜User｜>, <｜Assistant｜>, <think>, </think>), then the 256 byte
symbols, then the merges, to exactly --vocab ids.

--corpus arith trains on the problems and worked solutions of tools/arith/generate.py (training
seeds only) and splits every digit into its own piece first (a Split pre-tokenizer on \p{N}, as
DeepSeek splits \p{N}{1,3}), so numbers are spelled digit by digit: what a small model needs to
learn column arithmetic. That is the tokenizer of the arithmetic model (models/osprey-arith).

  python3 tools/make_bundled_tokenizer.py --vocab 512 --out /tmp/tok   # general text corpus
  python3 tools/make_bundled_tokenizer.py --corpus arith --vocab 512 --out models/osprey-arith
"""
import argparse
import json
import os
import random
import re
import sys
from collections import Counter

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>"]
# GPT-2's pre-tokenizer pattern without \p classes (Python's re lacks them): letters, digits,
# other non-space runs, and whitespace, each optionally with one leading space.
PIECE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def byte_alphabet():
    """GPT-2's reversible byte -> printable unicode map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def corpus(n, seed):
    rng = random.Random(seed)
    names = ["Ann", "Ben", "Carla", "Dev", "Emma", "Farid", "Gus", "Hana"]
    things = ["apples", "books", "coins", "pencils", "marbles", "stickers", "cookies", "cards"]
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(1, 50)
        who, what = rng.choice(names), rng.choice(things)
        if rng.random() < 0.5:
            out.append(f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now? "
                       f"{a} + {b} = {a + b}. The answer is {a + b}.")
        else:
            a = a + b
            out.append(f"{who} had {a} {what} and gave away {b}. How many are left? "
                       f"{a} - {b} = {a - b}. The answer is {a - b}.")
    return out


ARITH_TRAIN_PROBLEMS = 5000


def arith_corpus(n):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "arith"))
    import generate  # tools/arith/generate.py
    return [p["question"] + " " + p["solution"] for p in generate.training_problems(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--corpus", choices=["simple", "arith"], default="simple")
    args = ap.parse_args()
    alpha = byte_alphabet()
    words = Counter()
    split_digits = args.corpus == "arith"
    lines = arith_corpus(ARITH_TRAIN_PROBLEMS) if split_digits else corpus(4000, args.seed)
    for line in lines:
        for part in (re.split(r"([0-9])", line) if split_digits else [line]):
            for piece in PIECE.findall(part):
                words[tuple(alpha[b] for b in piece.encode("utf-8"))] += 1
    n_merges = args.vocab - len(SPECIALS) - 256
    merges = []
    words = dict(words)
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for i in range(len(w) - 1):
                pairs[(w[i], w[i + 1])] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    vocab = {}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[alpha[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    assert len(vocab) == args.vocab, (len(vocab), args.vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    pre_tokenizer = byte_level
    if split_digits:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Isolated",
             "invert": False},
            byte_level]}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"add_bos_token": True, "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
                   "tokenizer_class": "LlamaTokenizerFast", "model_max_length": 2560}, f,
                  ensure_ascii=False, indent=1)
    print(f"{args.out}: {len(vocab)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
