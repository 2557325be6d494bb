#!/usr/bin/env python3
"""KV cache pressure client for the GPU machine (no Node.js there): the Python twin of
tests/server/pressure.mjs, same prompts, same checks.

  python3 tools/pressure_client.py uncontended|contended URL N PROMPT_LEN MAX_TOKENS VOCAB RESULT_JSON

uncontended: the N prompts one at a time; their greedy token ids are written to RESULT_JSON.
contended:   the N prompts all at once; each must complete with MAX_TOKENS tokens equal to
             RESULT_JSON's, osprey_num_preemptions_total must have grown, and afterwards no request
             runs or waits and no KV block is held. Prints a summary table; exit 1 on a failure.
Prompts are token ids (works with --load-format dummy); outputs are read as ids through logprobs
with return_tokens_as_token_ids.
"""
import json
import sys
import threading
import time
import urllib.request

FIRST_ID = 16  # prompt ids stay away from the low (special) ids


def prompt(i, length, vocab):
    return [FIRST_ID + ((i * 7919 + j * 104729 + j * j) % (vocab - FIRST_ID)) for j in range(length)]


def http(url, path, body=None, timeout=3600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(url):
    _, text = http(url, "/metrics")
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        k, v = line.rsplit(" ", 1)
        out[k] = float(v)
    return out


def wait_idle(url, timeout_s=60.0):
    t0 = time.time()
    while True:
        m = metrics(url)
        if (m.get("osprey_num_requests_running") == 0 and m.get("osprey_num_requests_waiting") == 0
                and m.get("osprey_kv_cache_usage_perc") == 0):
            return m
        if time.time() - t0 > timeout_s:
            return m
        time.sleep(0.05)


def generate(url, i, length, max_tokens, vocab):
    t0 = time.time()
    status, body = http(url, "/v1/completions", {
        "prompt": prompt(i, length, vocab), "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True})
    ms = (time.time() - t0) * 1000
    if status != 200:
        return {"ok": False, "why": f"status {status}: {body[:200]}", "ms": ms}
    c = json.loads(body)["choices"][0]
    ids = [int(t[len("token_id:"):]) for t in c["logprobs"]["tokens"]]
    return {"ok": True, "ids": ids, "finish": c["finish_reason"], "ms": ms}


def main():
    mode, url, n, length, max_tokens, vocab, result_path = sys.argv[1:8]
    n, length, max_tokens, vocab = int(n), int(length), int(max_tokens), int(vocab)
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
            print("FAIL", what)

    before = metrics(url)
    t0 = time.time()
    if mode == "uncontended":
        results = [generate(url, i, length, max_tokens, vocab) for i in range(n)]
    else:
        results = [None] * n

        def run(i):
            results[i] = generate(url, i, length, max_tokens, vocab)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.time() - t0
    for i, r in enumerate(results):
        check(r["ok"], f"request {i}: {r.get('why')}")
        if r["ok"]:
            check(len(r["ids"]) == max_tokens and r["finish"] == "length",
                  f"request {i}: {len(r['ids'])} tokens ({r['finish']}), expected {max_tokens}")
    idle = wait_idle(url)
    check(idle.get("osprey_num_requests_running") == 0 and idle.get("osprey_num_requests_waiting") == 0,
          "nothing running or waiting afterwards")
    check(idle.get("osprey_kv_cache_usage_perc") == 0,
          f"no KV block held afterwards (usage {idle.get('osprey_kv_cache_usage_perc')})")
    preempt = idle.get("osprey_num_preemptions_total", 0) - before.get("osprey_num_preemptions_total", 0)
    if mode == "uncontended":
        with open(result_path, "w") as f:
            json.dump({"N": n, "L": length, "M": max_tokens, "tokens": [r.get("ids") for r in results]}, f)
        print(f"pressure uncontended: {n} prompts of {length} tokens, {max_tokens} out each, "
              f"{wall:.1f} s, preemptions {preempt:.0f}")
    else:
        ref = json.load(open(result_path))
        check(ref["N"] == n and ref["L"] == length and ref["M"] == max_tokens,
              "the uncontended run used the same sizes")
        equal, diverged = 0, []
        for i, r in enumerate(results):
            if not r["ok"]:
                continue
            a = ref["tokens"][i]
            k = next((j for j, (x, y) in enumerate(zip(r["ids"], a)) if x != y), -1)
            if k < 0 and len(r["ids"]) == len(a):
                equal += 1
            else:
                diverged.append(f"{i}@{k}")
        check(equal == n, f"greedy outputs equal to the uncontended run: {equal} of {n} "
                          f"(diverged prompt@token: {' '.join(diverged[:10])})")
        check(preempt > 0, f"the KV cache forced preemptions (grew by {preempt:.0f})")
        ms = sorted(r["ms"] for r in results if r["ok"])
        rows = [("concurrent requests", n), ("prompt tokens each", length),
                ("output tokens each", max_tokens),
                ("completed", f"{sum(r['ok'] for r in results)} of {n}"),
                ("outputs equal to uncontended", f"{equal} of {n}"), ("preemptions", f"{preempt:.0f}"),
                ("KV cache usage after", idle.get("osprey_kv_cache_usage_perc")),
                ("wall time (s)", f"{wall:.1f}"),
                ("latency median / max (s)",
                 f"{ms[len(ms) // 2] / 1000:.1f} / {ms[-1] / 1000:.1f}" if ms else "-")]
        print("| pressure run | value |\n|---|---|")
        for k, v in rows:
            print(f"| {k} | {v} |")
    print(f"pressure_{mode}: {'FAIL' if failures else 'PASS'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
