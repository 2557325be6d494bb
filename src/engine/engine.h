// The engine: requests in, a stream of model steps, outputs out.
//   step(): Scheduler::schedule → StepInputs::build → DeepseekModel::forward (logits of the
//   sampled rows only, left on the model's device) → Sampler::sample (on that device; the sampled
//   ids and requested logprobs come back) → Scheduler::commit → text deltas and stop strings.
// With speculative decoding (EngineConfig::speculative, MTP): after scheduling, MtpDrafter::extend
// lengthens the drafts of the scheduled decodes; the forward verifies them (1 + K sampled rows per
// decode, engine/spec_verify.h); MtpDrafter::catch_up runs the MTP layer over the kept positions
// and proposes the next first drafts; commit_verified keeps the accepted tokens.
// Async scheduling (EngineConfig::async_scheduling, on by default; vLLM's async scheduling,
// SGLang's overlap scheduler): step() launches the forward of step N+1 on the StepExecutor's
// worker and commits step N while it runs, so scheduling, the step-input build, commit, text
// deltas and stop strings are off the device's critical path:
//   schedule N+1 (N's tokens pending) → build N+1 → wait for forward N → sample N → write N's
//   tokens into N+1's pending inputs → launch forward N+1 → commit N, text, outputs of N.
// Sampling still reads each sequence's committed output (through N − 1, as the synchronous
// loop), so outputs are the same token for token. A sequence that finishes at N (a stop token,
// a stop string, an abort) while step N+1 holds it gets nothing from N+1: that token is dropped,
// never emitted, and its KV blocks were freed at N's commit (N+1's write into them lands before
// any later step can reuse them: steps run in order). One that max_tokens or max_model_len ends at
// N is not scheduled at N+1. With speculative decoding or a parallel model the loop stays
// synchronous (MTP's drafts for N+1 need N's tokens on the host; the lockstep publisher is not
// driven from a second thread).
// Engine is single-threaded (it owns all model state; only the forward runs on the executor's
// worker); AsyncEngine runs it on its own thread behind a submission queue and per-request output
// streams (engine/async_engine.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda_graph_runner.h"
#include "engine/mtp_drafter.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/speculative_config.h"
#include "engine/step_executor.h"
#include "engine/step_inputs.h"
#include "engine/text_decoder.h"
#include "kv/block_pool.h"
#include "kv/paged_cache.h"
#include "model/deepseek.h"

namespace osprey {

// EngineConfig::cuda_graph_sampling's default: on, unless OSPREY_CUDA_GRAPH_SAMPLING=0.
bool cuda_graph_sampling_default();

// The server's default token budget, vLLM's for its OpenAI server: 8192 tokens a step on a GPU
// with at least 70 GiB of memory that is not an A100 (H100, H200: `device_name` as CUDA reports
// it), 2048 otherwise (smaller GPUs, the CPU). On the dsv32 proxy's 5000/500/64 wave (H100,
// 2026-12-06) 8192 took 10.17 s against 2048's 10.67 s (bench/RESULTS.md).
int server_default_max_num_batched_tokens(bool gpu, size_t total_bytes,
                                          const std::string& device_name);

struct EngineConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;   // 0: the model's max_position_embeddings
  int64_t num_blocks = 0;  // 0: from kv_cache_bytes
  int64_t kv_cache_bytes = int64_t(256) << 20;
  bool enable_prefix_caching = true;
  uint64_t seed = 0;              // seeds for requests that bring none (0: random)
  SpeculativeConfig speculative;  // off unless set (the model needs its MTP layer)
  TokenBudgetPolicy token_budget_policy = TokenBudgetPolicy::Fixed;  // scheduler.h
  double target_step_ms = 0;  // StepTime's target (0: automatic, see SchedulerConfig)
  // Schedule and build step N+1 while step N runs (see above). On by default: the outputs are
  // the same as the synchronous loop's and the host's work leaves the device's critical path.
  // Ignored (synchronous) with speculative decoding or a parallel model.
  bool async_scheduling = true;
  // Pure decode and speculative verify steps as replays of CUDA graphs captured per padded
  // batch-size bucket and tokens a sequence (engine/cuda_graph_runner.h). Off by default here;
  // the CLI turns it on for a model on one GPU (cli/engine_flags.h: --enforce-eager,
  // --cuda-graph); prefill and mixed steps and the MTP drafter's forwards stay eager. Needs the
  // model on the GPU (not parallel): the Engine fails at construction otherwise.
  bool cuda_graph = false;
  // With cuda_graph: pure decode steps are sampled inside their graph and only the ids come back
  // (cuda_graph_runner.h). false: the graphs end with the logits and the Sampler runs after the
  // replay (the reference the GPU tests compare the in-graph sampling with, token for token).
  // On by default: its GPU tests passed on the H200 (test_cuda_graph_step 11/11 with the in-graph
  // vs host sampling ones, 2026-12-01; test_async_scheduling 24/24 with its cuda_graph_sampling
  // variant against the synchronous loop across preemption, aborts, stops and prefix caching,
  // 2026-12-03). OSPREY_CUDA_GRAPH_SAMPLING=0 turns it off (the host-sampling reference).
  bool cuda_graph_sampling = cuda_graph_sampling_default();
  std::vector<int> cuda_graph_capture_sizes;  // empty: cuda_graph_capture_sizes(max_num_seqs)
};

// One engine step's shape and time, as /metrics reports them by kind.
enum class StepKind {
  Decode,
  Mixed,
  Prefill
};                                       // decodes only; decodes + prompt chunks; chunks only
const char* step_kind_name(StepKind k);  // "decode", "mixed", "prefill"
struct StepRecord {
  StepKind kind = StepKind::Decode;
  // Measured: synchronous, scheduling to commit; async scheduling, the device's busy time
  // (forward start to end on the executor + sampling).
  double seconds = 0;
  double predicted_seconds = 0;  // the step-time model's prediction before it ran
  // Host time on the critical path before the launch: schedule + build (+ writing the pending
  // inputs and the hand-over to the executor with async scheduling), excluding the wait for the
  // previous step and its sampling.
  double host_seconds = 0;
  // The device's idle gap before this step: from the previous step's sampled ids arriving to this
  // step's forward starting. −1 when the device had nothing queued before (the first step after
  // an idle engine).
  double device_idle_seconds = -1;
  // A parallel model: rank 0's seconds inside its collectives during the step (all-reduce,
  // all-gather, all-to-all of the forward; the host's wall time around each call, the wait for
  // the other ranks included: dist/timed_comm.h). 0 on one rank. (A parallel model steps
  // synchronously, so the difference over the step is the forward's alone.)
  double comm_seconds = 0;
  int num_decodes = 0;
  int64_t decode_context_tokens = 0;  // Σ over the decodes of their context
  int num_chunks = 0;
  int64_t prefill_tokens = 0;        // prompt-chunk tokens
  int64_t prefill_start_tokens = 0;  // Σ over the chunks of their first position
};

struct TokenLogprob {
  int32_t token;
  float logprob;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct RequestOutput {
  uint64_t id = 0;
  std::vector<int32_t> new_tokens;     // generated since the previous output of this request
  std::vector<TokenLogprob> logprobs;  // one per new token, when the request asked
  std::string text;                    // text delta (with a decoder)
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::string stop_string;  // the stop string that ended it, if one did
  int32_t stop_token = -1;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prompt_tokens_total = 0;  // prompt tokens computed (not served from the cache)
  int64_t generation_tokens_total = 0;
  int64_t num_preemptions = 0;
  int64_t steps = 0;
  double last_step_seconds = 0;
  // Speculative decoding: draft tokens verified, accepted, and verify steps (one per sequence
  // with at least one draft per step). Acceptance rate = accepted / drafts; mean accepted
  // length = 1 + accepted / verifies (tokens a verify emits, the bonus counted).
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verifies = 0;
  // Async scheduling: tokens sampled for a sequence that had finished (a stop token or string, an
  // abort) after the step was launched; dropped, never emitted.
  int64_t async_discarded_tokens = 0;
  // Async scheduling: steps whose launch found the executor's worker asleep (each paid a thread
  // wake-up before the forward started; on CUDA the engine keeps the worker awake for the launch
  // that follows the wait, so only the first launch after an idle engine should).
  int64_t async_worker_wakeups = 0;
  // CUDA graphs (EngineConfig::cuda_graph): decode and verify steps replayed, and graphs captured
  // (a key's first step, or after the memory a graph points at moved).
  int64_t cuda_graph_replays = 0;
  int64_t cuda_graph_captures = 0;
  int64_t cuda_graph_capture_failures = 0;  // buckets that fell back to eager steps
  // Steps that ran eagerly with CUDA graphs on, by the runner's reason (prefill and mixed steps
  // count as "not a pure decode ..."; a decode step here says why graphs did not engage).
  std::map<std::string, int64_t> cuda_graph_eager_steps;
  // Graph steps sampled inside the graph (only their ids came back), and graph steps whose
  // sampling ran on the host path after the replay (the Sampler over the logits), by the runner's
  // reason (cuda_graph_sampling_unsupported).
  int64_t cuda_graph_sampled_steps = 0;
  std::map<std::string, int64_t> cuda_graph_host_sampling_steps;
  StepRecord last_step;  // the latest model step (valid once steps > 0)
};

class Engine {
 public:
  Engine(const DeepseekModel& model, const EngineConfig& cfg, TextDecoderFactory decoders = {});

  // Checks a request without queuing it; throws osprey::Error with the reason (prompt empty or
  // longer than max_model_len, token ids outside the vocabulary, invalid sampling values).
  void validate(const std::vector<int32_t>& prompt, const SamplingParams& params) const;
  // Queues a request under `id` (unique among live requests). Throws like validate().
  void add_request(uint64_t id, std::vector<int32_t> prompt, SamplingParams params);
  // Ends a request now (its final output is returned by the next step()).
  void abort(uint64_t id);
  bool has_unfinished() const { return !live_.empty(); }
  // One model step (or none if nothing can run); the outputs of every request that advanced.
  std::vector<RequestOutput> step();

  struct Result {
    std::vector<int32_t> tokens;
    std::string text;
    FinishReason finish_reason = FinishReason::None;
  };
  // Offline: runs the prompts together to completion; results in input order.
  std::vector<Result> generate(const std::vector<std::vector<int32_t>>& prompts,
                               const std::vector<SamplingParams>& params);

  EngineStats stats() const;
  const BlockPool& block_pool() const { return pool_; }
  const ModelConfig& model_config() const { return model_.config(); }
  const StepTimeModel& step_time_model() const { return step_model_; }
  int max_model_len() const { return sched_cfg_.max_model_len; }
  const SpeculativeConfig& speculative() const { return spec_; }
  // Whether steps overlap (EngineConfig::async_scheduling where it applies).
  bool async_scheduling() const { return executor_.has_worker(); }

 private:
  struct Live {
    std::unique_ptr<Sequence> seq;
    std::unique_ptr<TextDecoder> decoder;
    std::string text;     // decoded output text so far (cut at a stop string)
    size_t emitted = 0;   // bytes of text already returned
    size_t max_stop = 0;  // longest stop string
    RequestOutput pending;
  };
  // ends: the sequence finished at this token (in commit). True when a stop string ended it.
  bool on_token(Live& l, const SampleResult* r, int32_t token, bool ends);
  bool check_stop_strings(Live& l);
  RequestOutput take_output(Live& l);

  using Clock = StepExecutor::Clock;
  // Per sampled plan entry: its sequence, first sample row, and the tokens it emits.
  struct Emitted {
    Sequence* seq;
    size_t first_row;
    std::vector<int32_t> tokens;
  };
  // A step launched on the executor whose tokens are not committed yet (async scheduling).
  struct Launched {
    // User-provided: clang sees a nested class with member initializers as not yet
    // default-constructible inside its enclosing class (std::optional::emplace).
    Launched() {}
    StepPlan plan;
    StepShape shape;
    StepRecord record;
    bool follows = false;            // launched right after the previous step was sampled
    Clock::time_point prev_sampled;  // when that previous step's ids arrived
    double sample_seconds = 0;       // its own sampling, once sampled
    // A pure decode step with CUDA graphs: its rows were prepared at the launch (Sampler::prepare)
    // and may be sampled inside the graph (null otherwise: sampled after the forward). Owned
    // apart, so that the executor's pointer to it survives moving the Launched.
    std::unique_ptr<GraphSampling> graph_sampling;
  };
  // The model step on the executor: a CUDA graph replay where graphs_ takes it, else eager.
  // sampling: the step's prepared rows, to sample inside the graph (null: logits only).
  // fo.hidden_out set (speculative decoding): a graph writes the hidden states into the drafter's
  // whole buffer (rows up to the bucket's tokens).
  void run_forward(const ForwardBatch& batch, Tensor logits, Tensor logits_buffer,
                   const ForwardOptions& fo, GraphSampling* sampling = nullptr);
  // The logits rows the step of `batch` needs: its sampled rows, or a graph's padded rows.
  int64_t logits_rows(const StepPlan& plan, const ForwardBatch& batch) const;
  // With CUDA graphs, for a pure decode step: prepares the sampled rows of `plan` in the Sampler
  // before the launch (pending: the in-flight step's token of each sequence that has one, with
  // async scheduling) and returns what the graph samples from; null when the step is no
  // candidate for a graph (it is then sampled after the forward as before).
  std::unique_ptr<GraphSampling> prepare_graph_sampling(
      const StepPlan& plan, const ForwardBatch& batch,
      const std::vector<std::pair<const Sequence*, int32_t>>& pending);
  // The step's results from a prepared sampling: the graph's ids, or the Sampler over the logits.
  void finish_graph_sampling(const GraphSampling& gs, Tensor logits,
                             std::vector<SampleResult>* results);
  std::vector<RequestOutput> step_sync();
  std::vector<RequestOutput> step_async();
  // Waits for the launched step's forward and samples its rows into *results.
  void sample_launched(Launched& l, std::vector<SampleResult>* results);
  // Commits the launched step's sampled tokens, emits them and records the step.
  void commit_launched(Launched& l, const std::vector<SampleResult>& results);
  // The committed tokens into each request's pending output (text, stop strings).
  void emit_tokens(const std::vector<Emitted>& emitted, const std::vector<SampleResult>& results);
  // Fills the shape fields and kind of a finished step's record; calibrates; keeps it as last.
  void record_step(StepRecord record, const StepShape& shape);
  // The outputs of every request that advanced or finished; finished requests are dropped.
  std::vector<RequestOutput> collect_outputs();

  const DeepseekModel& model_;
  SpeculativeConfig spec_;
  SchedulerConfig sched_cfg_;
  BlockPool pool_;
  PagedKVCache cache_;
  StepTimeModel step_model_;  // before scheduler_, which reads it
  Scheduler scheduler_;
  // Step inputs: [0] for the synchronous loop; with async scheduling [0] and [1] alternate (the
  // step in flight reads one while the next is built into the other).
  std::unique_ptr<StepInputs> inputs_[2];
  int next_inputs_ = 0;
  // [≥ max_num_seqs, vocab] F32 on the model's device, rows [0, num_sampled) used (a graph step:
  // rows up to its bucket · tokens a sequence written)
  Storage logits_;
  Sampler sampler_;
  std::unique_ptr<MtpDrafter> drafter_;      // speculative decoding only
  std::unique_ptr<CudaGraphRunner> graphs_;  // EngineConfig::cuda_graph only
  bool graph_sampling_ = false;              // EngineConfig::cuda_graph_sampling (with graphs_)
  TextDecoderFactory decoders_;
  std::mt19937_64 seed_rng_;
  uint64_t arrivals_ = 0;
  std::map<uint64_t, Live> live_;
  std::vector<uint64_t> aborted_;
  EngineStats counters_;
  std::optional<Launched> in_flight_;  // async scheduling: the step on the executor
  // Finished sequences the step in flight may still name (kept until it is committed).
  std::vector<std::unique_ptr<Sequence>> retired_;
  Clock::time_point last_sampled_;  // when the last step's sampled ids arrived
  bool device_waiting_ = false;     // the device idles since then for the host, not for work
  StepExecutor executor_;           // last: its destructor waits for the step in flight
};

}  // namespace osprey
