#include "bench/engine_loop.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "core/error.h"
#include "engine/engine.h"

namespace osprey::bench {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct LoopResult {
  std::vector<double> host_s, idle_s, busy_s;
  double wall_per_step_s = 0;
  std::vector<std::vector<int32_t>> tokens;  // per request
  int decode_steps = 0;
};

LoopResult run_loop(const DeepseekModel& model, const EngineLoopOptions& o, int B, bool async,
                    const std::vector<std::vector<int32_t>>& prompts) {
  const int steps = o.warmup + o.iters;
  EngineConfig cfg;
  cfg.async_scheduling = async;
  cfg.max_num_seqs = B;
  cfg.max_model_len = int(o.context) + steps + 2;
  const int64_t blocks_per_seq = (cfg.max_model_len + kBlockSize - 1) / kBlockSize;
  cfg.num_blocks = blocks_per_seq * B;
  cfg.enable_prefix_caching = false;  // random prompts: nothing to share
  cfg.seed = o.seed + 1;
  Engine e(model, cfg);
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = steps + 1;  // the prefill's token, then `steps` decodes
  for (int i = 0; i < B; ++i) e.add_request(uint64_t(i + 1), prompts[size_t(i)], p);
  LoopResult r;
  r.tokens.resize(static_cast<size_t>(B));
  int64_t seen = 0;
  auto t_first = std::chrono::steady_clock::now(), t_last = t_first;
  int timed = 0;
  while (e.has_unfinished()) {
    for (RequestOutput& out : e.step()) {
      auto& t = r.tokens[size_t(out.id - 1)];
      t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
    }
    const EngineStats s = e.stats();
    if (s.steps == seen) continue;
    seen = s.steps;
    const StepRecord& rec = s.last_step;
    if (rec.kind != StepKind::Decode || rec.num_decodes != B) continue;
    const auto now = std::chrono::steady_clock::now();
    if (r.decode_steps++ < o.warmup) {
      t_first = now;
      continue;
    }
    r.host_s.push_back(rec.host_seconds);
    if (rec.device_idle_seconds >= 0) r.idle_s.push_back(rec.device_idle_seconds);
    r.busy_s.push_back(rec.seconds);
    t_last = now;
    ++timed;
  }
  if (timed > 0)
    r.wall_per_step_s = std::chrono::duration<double>(t_last - t_first).count() / timed;
  return r;
}

}  // namespace

void run_engine_loop(DeepseekModel& model, const EngineLoopOptions& o) {
  if (o.iters < 1 || o.warmup < 0) fail("--iters must be at least 1 and --warmup at least 0");
  const ModelConfig& c = model.config();
  // As the server does: steps whose Σ seq_lens passes one sequence's length run absorbed (the
  // expanded path's memory grows with it).
  model.set_max_expanded_kv_rows(o.context + o.warmup + o.iters + 2);
  if (o.context + o.warmup + o.iters + 2 > c.max_position_embeddings)
    fail("--context ", o.context,
         " + the decode steps exceeds the model's max_position_embeddings (",
         c.max_position_embeddings, ")");
  std::printf(
      "\nengine loop: B requests of %lld random prompt tokens, greedy, %d decode steps after %d "
      "(medians per decode step; host = schedule start to launch without the wait for the "
      "previous step; idle = the device's gap between steps; busy = forward + sampling, "
      "synchronous: the whole step)\n",
      (long long)o.context, o.iters, o.warmup);
  std::printf("%-6s %5s %10s %10s %10s %12s %10s %s\n", "mode", "B", "host_us", "idle_us",
              "busy_ms", "wall_ms/step", "tok/s", "tokens");
  std::mt19937 rng(uint32_t(o.seed));
  std::uniform_int_distribution<int> tok(2, c.vocab_size - 1);
  for (int B : o.batches) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    for (auto& pr : prompts) {
      pr.resize(size_t(o.context));
      for (auto& x : pr) x = tok(rng);
    }
    const LoopResult sync = run_loop(model, o, B, false, prompts);
    const LoopResult async = run_loop(model, o, B, true, prompts);
    for (const LoopResult* r : {&sync, &async}) {
      const bool is_async = r == &async;
      const char* same = !is_async                     ? "reference"
                         : async.tokens == sync.tokens ? "identical to synchronous"
                                                       : "DIFFER from synchronous";
      std::printf("%-6s %5d %10.1f %10.1f %10.3f %12.3f %10.0f %s\n", is_async ? "async" : "sync",
                  B, median(r->host_s) * 1e6, median(r->idle_s) * 1e6, median(r->busy_s) * 1e3,
                  r->wall_per_step_s * 1e3,
                  r->wall_per_step_s > 0 ? double(B) / r->wall_per_step_s : 0.0, same);
    }
    if (async.tokens != sync.tokens)
      std::printf("engine loop: B=%d async scheduling changed the greedy tokens\n", B);
  }
}

}  // namespace osprey::bench
