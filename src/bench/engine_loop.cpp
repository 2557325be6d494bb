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

// The lengths one batch size needs. The prompts go in by chunks of the step budget less one token
// per decoding request; a request whose prompt is in decodes meanwhile (mixed steps), so
// max_tokens covers those tokens as well as the warm-up and measured decode steps.
struct LoopShape {
  int64_t prefill_steps = 0;  // bound on the steps until every prompt is in
  int max_tokens = 0;         // per request: never reached before the measurement ends
  int max_model_len = 0;      // prompt + max_tokens (+ 1: the engine's limit includes it)
  int64_t step_calls = 0;     // bound on Engine::step() calls before the measurement must end
};
LoopShape loop_shape(const EngineLoopOptions& o, int B) {
  LoopShape s;
  const int64_t per_step = std::max<int64_t>(1, o.max_num_batched_tokens - B);
  // + B: a request's last chunk may share its step with nothing else.
  s.prefill_steps = (int64_t(B) * o.context + per_step - 1) / per_step + B;
  const int64_t max_tokens = s.prefill_steps + o.warmup + o.iters + 2;
  s.max_tokens = int(std::min<int64_t>(max_tokens, 1 << 30));
  s.max_model_len = int(std::min<int64_t>(o.context + max_tokens + 1, 1 << 30));
  // Twice the prefill bound (a slack for the scheduler's packing), the decode steps, and the
  // async loop's extra calls (its first call launches without committing, its last drains).
  s.step_calls = 2 * s.prefill_steps + o.warmup + o.iters + 8;
  return s;
}

struct LoopResult {
  std::vector<double> host_s, idle_s, busy_s;
  double wall_per_step_s = 0;
  std::vector<std::vector<int32_t>> tokens;  // per request
  int decode_steps = 0;                      // pure decode steps of all B (warm-up included)
  int timed = 0;
  int64_t engine_steps = 0;
  int64_t worker_wakeups = 0;
  std::string error;
};

LoopResult run_loop(const DeepseekModel& model, const EngineLoopOptions& o, const LoopShape& sh,
                    int B, bool async, const std::vector<std::vector<int32_t>>& prompts) {
  EngineConfig cfg;
  cfg.async_scheduling = async;
  cfg.max_num_seqs = B;
  cfg.max_num_batched_tokens = o.max_num_batched_tokens;
  cfg.max_model_len = sh.max_model_len;
  const int64_t blocks_per_seq = (cfg.max_model_len + kBlockSize - 1) / kBlockSize;
  cfg.num_blocks = blocks_per_seq * B;  // every request at its longest: no preemption
  cfg.enable_prefix_caching = false;    // random prompts: nothing to share
  cfg.seed = o.seed + 1;
  Engine e(model, cfg);
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = sh.max_tokens;
  for (int i = 0; i < B; ++i) e.add_request(uint64_t(i + 1), prompts[size_t(i)], p);
  LoopResult r;
  r.tokens.resize(static_cast<size_t>(B));
  auto take = [&](std::vector<RequestOutput> outs) {
    for (RequestOutput& out : outs) {
      auto& t = r.tokens[size_t(out.id - 1)];
      t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (out.finished && r.timed < o.iters && r.error.empty())
        r.error = "request " + std::to_string(out.id) + " finished (" +
                  std::to_string(out.completion_tokens) + " tokens) before the measurement ended";
    }
  };
  int64_t seen = 0, calls = 0;
  auto t_first = std::chrono::steady_clock::now(), t_last = t_first;
  while (e.has_unfinished() && r.timed < o.iters && r.error.empty()) {
    if (++calls > sh.step_calls) {
      r.error = "no " + std::to_string(o.warmup + o.iters) + " decode steps of all " +
                std::to_string(B) + " requests within " + std::to_string(sh.step_calls) +
                " engine steps (" + std::to_string(r.decode_steps) + " seen)";
      break;
    }
    take(e.step());
    const EngineStats s = e.stats();
    if (s.steps == seen) continue;
    seen = s.steps;
    const StepRecord& rec = s.last_step;
    if (rec.kind != StepKind::Decode || rec.num_decodes != B) {
      if (r.decode_steps > 0 && r.error.empty())
        r.error = std::string("a ") + step_kind_name(rec.kind) + " step of " +
                  std::to_string(rec.num_decodes) + " decodes after the first decode step of all " +
                  std::to_string(B);
      continue;  // prompts still going in
    }
    const auto now = std::chrono::steady_clock::now();
    if (r.decode_steps++ < o.warmup) {
      t_first = now;
      continue;
    }
    r.host_s.push_back(rec.host_seconds);
    if (rec.device_idle_seconds >= 0) r.idle_s.push_back(rec.device_idle_seconds);
    r.busy_s.push_back(rec.seconds);
    t_last = now;
    ++r.timed;
  }
  r.engine_steps = e.stats().steps;
  r.worker_wakeups = e.stats().async_worker_wakeups;
  if (r.error.empty() && r.timed < o.iters)
    r.error = "the requests ended after " + std::to_string(r.timed) + " measured decode steps";
  // Done: the requests are aborted (async: the step in flight is dropped, never emitted).
  for (int i = 0; i < B; ++i) e.abort(uint64_t(i + 1));
  while (e.has_unfinished()) {
    for (RequestOutput& out : e.step()) {
      auto& t = r.tokens[size_t(out.id - 1)];
      t.insert(t.end(), out.new_tokens.begin(), out.new_tokens.end());
    }
  }
  if (r.timed > 0)
    r.wall_per_step_s = std::chrono::duration<double>(t_last - t_first).count() / r.timed;
  return r;
}

EngineLoopRow row_of(const LoopResult& r, int B, bool async) {
  EngineLoopRow x;
  x.batch = B;
  x.async = async;
  x.measured_steps = r.timed;
  x.engine_steps = r.engine_steps;
  x.worker_wakeups = r.worker_wakeups;
  x.host_s = median(r.host_s);
  x.idle_s = median(r.idle_s);
  x.busy_s = median(r.busy_s);
  x.wall_per_step_s = r.wall_per_step_s;
  x.error = r.error;
  return x;
}

}  // namespace

std::vector<EngineLoopRow> run_engine_loop(DeepseekModel& model, const EngineLoopOptions& o) {
  if (o.iters < 1 || o.warmup < 0) fail("--iters must be at least 1 and --warmup at least 0");
  if (o.context < 1) fail("--context must be at least 1 (the prompt's tokens)");
  if (o.max_num_batched_tokens < 1) fail("max_num_batched_tokens must be at least 1");
  const ModelConfig& c = model.config();
  for (int B : o.batches) {
    if (B < 1) fail("--batch sizes must be at least 1, got ", B);
    const LoopShape sh = loop_shape(o, B);
    if (sh.max_model_len > c.max_position_embeddings)
      fail("--context ", o.context, " + the tokens each of the ", B,
           " requests decodes while the prompts go in and the ", o.warmup + o.iters,
           " decode steps (", sh.max_model_len,
           " positions) exceeds the model's "
           "max_position_embeddings (",
           c.max_position_embeddings, ")");
  }
  std::printf(
      "\nengine loop: B requests of %lld random prompt tokens (chunked prefill, %d tokens a step), "
      "greedy; once all B decode, %d decode steps after %d (medians per decode step; host = "
      "schedule start to launch without the wait for the previous step; idle = the device's gap "
      "between steps; busy = forward + sampling, synchronous: the whole step)\n",
      (long long)o.context, o.max_num_batched_tokens, o.iters, o.warmup);
  std::printf("%-6s %5s %10s %10s %10s %12s %10s %s\n", "mode", "B", "host_us", "idle_us",
              "busy_ms", "wall_ms/step", "tok/s", "tokens");
  std::mt19937 rng(uint32_t(o.seed));
  std::uniform_int_distribution<int> tok(2, c.vocab_size - 1);
  std::vector<EngineLoopRow> rows;
  int failed = 0;
  for (int B : o.batches) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    for (auto& pr : prompts) {
      pr.resize(size_t(o.context));
      for (auto& x : pr) x = tok(rng);
    }
    const LoopShape sh = loop_shape(o, B);
    // As the server does: steps whose Σ seq_lens passes one sequence's length run absorbed (the
    // expanded path's memory grows with it).
    model.set_max_expanded_kv_rows(sh.max_model_len);
    const LoopResult sync = run_loop(model, o, sh, B, false, prompts);
    const LoopResult async = run_loop(model, o, sh, B, true, prompts);
    const bool same = async.tokens == sync.tokens;
    for (const LoopResult* r : {&sync, &async}) {
      const bool is_async = r == &async;
      EngineLoopRow row = row_of(*r, B, is_async);
      row.tokens_identical = !is_async || same;
      const char* mode = is_async ? "async" : "sync";
      if (!row.error.empty()) {
        ++failed;
        std::printf("%-6s %5d error: %s (%lld engine steps; nothing measured)\n", mode, B,
                    row.error.c_str(), static_cast<long long>(row.engine_steps));
      } else {
        const char* tokens = !is_async ? "reference"
                             : same    ? "identical to synchronous"
                                       : "DIFFER from synchronous";
        std::printf("%-6s %5d %10.1f %10.1f %10.3f %12.3f %10.0f %s\n", mode, B, row.host_s * 1e6,
                    row.idle_s * 1e6, row.busy_s * 1e3, row.wall_per_step_s * 1e3,
                    row.wall_per_step_s > 0 ? double(B) / row.wall_per_step_s : 0.0, tokens);
      }
      rows.push_back(std::move(row));
    }
    if (async.error.empty())
      std::printf("  async B=%d: %lld of %lld launches woke the executor's sleeping worker\n", B,
                  static_cast<long long>(async.worker_wakeups),
                  static_cast<long long>(async.engine_steps));
    if (!same && sync.error.empty() && async.error.empty())
      std::printf("engine loop: B=%d async scheduling changed the greedy tokens\n", B);
  }
  std::fflush(stdout);
  if (failed > 0)
    fail("engine loop: ", failed, " of ", rows.size(),
         " rows measured nothing (the errors are printed above)");
  return rows;
}

}  // namespace osprey::bench
