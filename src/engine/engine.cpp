#include "engine/engine.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "core/error.h"
#include "engine/spec_verify.h"
#include "ops/mla.h"

namespace osprey {

int server_default_max_num_batched_tokens(bool gpu, size_t total_bytes,
                                          const std::string& device_name) {
  constexpr size_t kLargeGpuBytes = size_t(70) << 30;
  std::string lower = device_name;
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  // vLLM (engine/arg_utils.py) leaves the A100 at 2048: larger budgets lowered its throughput.
  if (gpu && total_bytes >= kLargeGpuBytes && lower.find("a100") == std::string::npos) return 8192;
  return 2048;
}

bool cuda_graph_sampling_default() {
  const char* e = std::getenv("OSPREY_CUDA_GRAPH_SAMPLING");
  return !(e && std::string_view(e) == "0");
}

namespace {

SchedulerConfig make_sched_config(const DeepseekModel& m, const EngineConfig& cfg) {
  const ModelConfig& mc = m.config();
  SchedulerConfig s;
  if (cfg.speculative.enabled()) {
    if (!m.has_mtp())
      fail(
          "--speculative-config method mtp: this model has no MTP layer (config.json "
          "num_nextn_predict_layers is ",
          mc.num_nextn_predict_layers, "; the checkpoint must hold model.layers.",
          mc.num_hidden_layers, ".*): serve it without --speculative-config");
    if (m.parallel()) fail("--speculative-config is not supported with a parallel model yet");
    s.num_speculative_tokens = cfg.speculative.num_speculative_tokens;
  }
  s.max_num_seqs = cfg.max_num_seqs;
  s.max_num_batched_tokens = cfg.max_num_batched_tokens;
  s.block_size = kBlockSize;
  s.max_model_len = cfg.max_model_len > 0 ? cfg.max_model_len : int(mc.max_position_embeddings);
  if (s.max_model_len > mc.max_position_embeddings)
    fail("max_model_len ", s.max_model_len, " exceeds the model's max_position_embeddings (",
         mc.max_position_embeddings, ")");
  if (s.max_num_seqs < 1) fail("max_num_seqs must be at least 1");
  if (s.max_num_batched_tokens < 1) fail("max_num_batched_tokens must be at least 1");
  s.enable_prefix_caching = cfg.enable_prefix_caching;
  s.eos_token_id = mc.eos_token_id;
  s.token_budget_policy = cfg.token_budget_policy;
  if (!(cfg.target_step_ms >= 0))
    fail("--target-step-ms must be >= 0 (0: automatic), got ", cfg.target_step_ms);
  s.target_step_s = cfg.target_step_ms * 1e-3;
  return s;
}

// The step-time model of `m` as it runs: its weights' and latent cache's formats, the attention
// path its prompt chunks take, the prior of its device.
StepTimeModel make_step_time_model(const DeepseekModel& m) {
  const ModelConfig& c = m.config();
  StepCostOptions o;
  o.fp8 = c.quant.fp8;
  o.latent_token_bytes = PagedKVCache::latent_token_bytes(c, m.device(), m.fp8_latent_cache());
  o.prefill_attention = c.has_indexer && ops::mla_absorbed_prefill_preferred(
                                             m.device(), c.num_attention_heads, c.kv_lora_rank,
                                             c.qk_rope_head_dim, /*sparse=*/true)
                            ? PrefillAttention::Absorbed
                            : PrefillAttention::Expanded;
  return StepTimeModel(c, o,
                       m.device() == Device::CUDA ? cuda_step_time_prior() : cpu_step_time_prior());
}

int64_t num_blocks_for(const DeepseekModel& m, const EngineConfig& cfg, const SchedulerConfig& s) {
  const int64_t per_block = m.kv_bytes_per_block(s.num_speculative_tokens > 0);
  const int64_t n = cfg.num_blocks > 0 ? cfg.num_blocks : cfg.kv_cache_bytes / per_block;
  const int64_t need = (int64_t(s.max_model_len) + kBlockSize - 1) / kBlockSize;
  if (n < need) {
    constexpr double kMiB = double(1 << 20);
    fail("the KV cache (", double(n * per_block) / kMiB, " MiB: ", n, " blocks of ", kBlockSize,
         " tokens at ", per_block, " bytes each) cannot hold one sequence of max_model_len ",
         s.max_model_len, " tokens, which needs ", need, " blocks (",
         double(need * per_block) / kMiB,
         " MiB): give the cache more memory (--kv-cache-memory; --gpu-memory-utilization on "
         "cuda) or lower --max-model-len");
  }
  return n;
}

// The longest prefix of s[0, end) that does not end inside a UTF-8 character.
size_t utf8_boundary(const std::string& s, size_t end) {
  size_t i = end;
  while (i > 0 && (uint8_t(s[i - 1]) & 0xC0) == 0x80) --i;  // continuation bytes
  if (i == 0) return 0;
  const uint8_t lead = uint8_t(s[i - 1]);
  const size_t len = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return (end - (i - 1) >= len) ? end : i - 1;
}

// The sampler's state key of a sequence: its arrival number (unique for the engine's lifetime,
// unlike request ids, which may be reused once a request is done), offset from 0 ("no key").
uint64_t sampler_key(const Sequence& s) {
  return s.arrival + 1;
}

}  // namespace

const char* step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::Decode:
      return "decode";
    case StepKind::Mixed:
      return "mixed";
    case StepKind::Prefill:
      return "prefill";
  }
  return "?";
}

Engine::Engine(const DeepseekModel& model, const EngineConfig& cfg, TextDecoderFactory decoders)
    : model_(model),
      spec_(cfg.speculative),
      sched_cfg_(make_sched_config(model, cfg)),
      pool_(num_blocks_for(model, cfg, sched_cfg_)),
      cache_(model.make_cache(pool_.n_blocks(), spec_.enabled())),
      step_model_(make_step_time_model(model)),
      scheduler_(sched_cfg_, pool_, &step_model_),
      drafter_(spec_.enabled() ? std::make_unique<MtpDrafter>(model, spec_.num_speculative_tokens,
                                                              sched_cfg_.max_num_batched_tokens,
                                                              sched_cfg_.max_num_seqs)
                               : nullptr),
      decoders_(std::move(decoders)),
      seed_rng_(cfg.seed ? cfg.seed : std::random_device{}()),
      executor_(cfg.async_scheduling && !spec_.enabled() && !model.parallel()) {
  for (int i = 0; i < (executor_.has_worker() ? 2 : 1); ++i)
    inputs_[i] = std::make_unique<StepInputs>(
        sched_cfg_.max_num_batched_tokens, sched_cfg_.max_num_seqs,
        (sched_cfg_.max_model_len + kBlockSize - 1) / kBlockSize, kBlockSize,
        sched_cfg_.max_num_seqs * (1 + sched_cfg_.num_speculative_tokens));
  if (cfg.cuda_graph) {
    std::vector<int> sizes = cfg.cuda_graph_capture_sizes;
    if (sizes.empty()) sizes = cuda_graph_capture_sizes(sched_cfg_.max_num_seqs);
    for (int b : sizes)
      if (b < 1 || b > sched_cfg_.max_num_seqs)
        fail("CUDA graph capture size ", b,
             " is outside [1, max_num_seqs = ", sched_cfg_.max_num_seqs, "]");
    // Ascending and distinct: a batch takes the smallest size that holds it.
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    graphs_ = std::make_unique<CudaGraphRunner>(model, std::move(sizes));
    graph_sampling_ = cfg.cuda_graph_sampling;
    // The penalty slots of a full batch from the start: the sampling graphs point at them, and a
    // growth (which moves them) would re-capture every bucket.
    if (graph_sampling_)
      sampler_.reserve(model.device(), int(model.config().vocab_size), sched_cfg_.max_num_seqs);
  }
}

void Engine::run_forward(const ForwardBatch& batch, Tensor logits, Tensor logits_buffer,
                         const ForwardOptions& fo, GraphSampling* sampling) {
  // Only the options the graphs capture (the engine sets no other: no dumps, no forced top-k).
  const bool graphable = !fo.dump && !fo.forced_topk && fo.path == AttentionPath::Auto;
  const Tensor hidden = fo.hidden_out.data && drafter_ ? drafter_->main_hidden_buffer() : Tensor{};
  if (graphs_ && graphable && (!fo.hidden_out.data || hidden.data) &&
      graphs_->forward(batch, cache_, logits_buffer, sampling, hidden))
    return;
  model_.forward(batch, cache_, logits, fo);
}

int64_t Engine::logits_rows(const StepPlan& plan, const ForwardBatch& batch) const {
  const int64_t graph = graphs_ ? graphs_->graph_rows(batch) : 0;
  return std::max<int64_t>({int64_t(plan.num_sampled), graph, sched_cfg_.max_num_seqs});
}

std::unique_ptr<GraphSampling> Engine::prepare_graph_sampling(
    const StepPlan& plan, const ForwardBatch& batch,
    const std::vector<std::pair<const Sequence*, int32_t>>& pending) {
  if (!graphs_ || !graph_sampling_ || drafter_ || !cuda_graph_ineligible(batch).empty())
    return nullptr;
  const int eos = model_.config().eos_token_id;
  std::vector<SamplingRow> rows;
  for (const ScheduledSeq& e : plan.seqs) {
    if (!e.sample) continue;
    const Sequence& s = *e.seq;
    SamplingRow row{&s.params, &s.prompt, &s.output,
                    s.seed,    eos,       s.finished() ? 0 : sampler_key(s)};
    const auto it = std::lower_bound(
        pending.begin(), pending.end(),
        std::pair<const Sequence*, int32_t>(&s, std::numeric_limits<int32_t>::min()));
    if (it != pending.end() && it->first == &s) row.pending_token = it->second;
    rows.push_back(row);
  }
  sampler_.prepare(model_.device(), int(model_.config().vocab_size), rows);
  auto gs = std::make_unique<GraphSampling>();
  gs->rows = &sampler_.prepared_rows();
  gs->lists = &sampler_.prepared_lists();
  gs->n_logprob_rows = sampler_.prepared_logprob_rows();
  gs->prompt_mask = sampler_.prompt_mask();
  gs->output_counts = sampler_.output_counts();
  return gs;
}

void Engine::finish_graph_sampling(const GraphSampling& gs, Tensor logits,
                                   std::vector<SampleResult>* results) {
  if (gs.sampled)
    sampler_.finish(gs.tokens, gs.logprobs, gs.top_ids, results);
  else
    sampler_.run_prepared(logits, results);
}

void Engine::validate(const std::vector<int32_t>& prompt, const SamplingParams& params) const {
  const ModelConfig& mc = model_.config();
  if (prompt.empty()) fail("the prompt is empty");
  if (int(prompt.size()) >= sched_cfg_.max_model_len)
    fail("the prompt has ", prompt.size(), " tokens; this model accepts at most ",
         sched_cfg_.max_model_len - 1, " (max_model_len ", sched_cfg_.max_model_len,
         " including at least one generated token)");
  for (int32_t t : prompt)
    if (t < 0 || t >= mc.vocab_size)
      fail("prompt token id ", t, " is outside the vocabulary [0, ", mc.vocab_size, ")");
  params.validate(mc.vocab_size);
}

void Engine::add_request(uint64_t id, std::vector<int32_t> prompt, SamplingParams params) {
  validate(prompt, params);
  if (live_.count(id)) fail("request id ", id, " is already in use");
  Live l;
  l.seq = std::make_unique<Sequence>();
  Sequence& s = *l.seq;
  s.id = id;
  s.arrival = arrivals_++;
  s.prompt = std::move(prompt);
  s.params = std::move(params);
  s.seed = s.params.seed ? *s.params.seed : seed_rng_();
  if (decoders_) l.decoder = decoders_(s.params.skip_special_tokens);
  for (const auto& st : s.params.stop) l.max_stop = std::max(l.max_stop, st.size());
  l.pending.id = id;
  l.pending.prompt_tokens = int(s.prompt.size());
  scheduler_.add(&s);
  live_.emplace(id, std::move(l));
}

void Engine::abort(uint64_t id) {
  if (live_.count(id)) aborted_.push_back(id);
}

bool Engine::check_stop_strings(Live& l) {
  const Sequence& s = *l.seq;
  if (s.params.stop.empty()) return false;
  // Only matches that end in the newly decoded text can be new.
  const size_t from = l.emitted > l.max_stop ? l.emitted - l.max_stop : 0;
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& st : s.params.stop) {
    const size_t p = l.text.find(st, from);
    if (p != std::string::npos && p < best) {
      best = p;
      which = &st;
    }
  }
  if (!which) return false;
  l.text.resize(best);
  l.pending.stop_string = *which;
  return true;
}

bool Engine::on_token(Live& l, const SampleResult* r, int32_t token, bool ends) {
  Sequence& s = *l.seq;
  l.pending.new_tokens.push_back(token);
  if (r && s.params.logprobs >= 0)
    l.pending.logprobs.push_back({token, r->logprob, r->top_logprobs});
  // The token that stopped the sequence (EOS, a stop id) is not part of the text.
  const bool stop_token = ends && s.finish == FinishReason::Stop && s.stop_token == token;
  if (l.decoder && !stop_token) {
    l.text += l.decoder->push(token);
    if (!ends && check_stop_strings(l)) {
      if (s.finished()) {
        // Finished by a later token of the same verify step (EOS, length): the stop string,
        // which comes first, is the reason.
        s.finish = FinishReason::Stop;
        s.stop_token = -1;
      } else {
        scheduler_.finish(&s, FinishReason::Stop);
      }
      return true;
    }
  }
  return false;
}

RequestOutput Engine::take_output(Live& l) {
  Sequence& s = *l.seq;
  RequestOutput out = std::move(l.pending);
  l.pending = RequestOutput{};
  l.pending.id = s.id;
  l.pending.prompt_tokens = int(s.prompt.size());
  if (s.finished() && l.decoder && out.stop_string.empty()) l.text += l.decoder->finish();
  // Hold back what could still become a stop string, and never split a character.
  size_t end = l.text.size();
  if (!s.finished() && l.max_stop > 0) end = end >= l.max_stop - 1 ? end - (l.max_stop - 1) : 0;
  if (!s.finished()) end = utf8_boundary(l.text, end);
  if (end > l.emitted) {
    out.text = l.text.substr(l.emitted, end - l.emitted);
    l.emitted = end;
  }
  out.finished = s.finished();
  out.finish_reason = s.finish;
  out.stop_token = s.finish == FinishReason::Stop ? s.stop_token : -1;
  out.completion_tokens = int(s.output.size());
  out.cached_tokens = s.num_prefix_hit_tokens;
  return out;
}

namespace {
double seconds_between(StepExecutor::Clock::time_point a, StepExecutor::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

std::vector<RequestOutput> Engine::step() {
  for (uint64_t id : aborted_) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    scheduler_.finish(it->second.seq.get(), FinishReason::Abort);
  }
  aborted_.clear();
  return executor_.has_worker() ? step_async() : step_sync();
}

std::vector<RequestOutput> Engine::step_sync() {
  const auto t0 = Clock::now();
  const double comm0 = model_.comm_seconds();
  const StepPlan plan = scheduler_.schedule();
  std::vector<Emitted> emitted;
  std::vector<SampleResult> results;
  StepShape shape;
  StepRecord record;
  if (!plan.empty()) {
    shape = step_shape(plan);
    record.predicted_seconds = step_model_.predict(shape);
    if (drafter_) {
      std::vector<Sequence*> seqs;
      std::vector<int> want;
      for (const ScheduledSeq& e : plan.seqs)
        if (e.num_draft > 0) {
          seqs.push_back(e.seq);
          want.push_back(e.num_draft);
        }
      drafter_->extend(seqs, want, cache_);
    }
    const ForwardBatch& batch = inputs_[0]->build(plan);
    // [num_sampled, vocab] on the model's device: sampled there, only the ids come back.
    const int64_t vocab = model_.config().vocab_size;
    if (const int64_t need = logits_rows(plan, batch);
        logits_.empty() || logits_.view().size(0) < need)
      logits_ = Storage(model_.device(), DType::F32, {need, vocab});
    const Tensor logits = logits_.view().rows(0, plan.num_sampled);
    ForwardOptions fo;
    if (drafter_) fo.hidden_out = drafter_->main_hidden(batch.attn.n_tokens);
    const auto t_launch = Clock::now();
    record.host_seconds = seconds_between(t0, t_launch);
    if (device_waiting_) record.device_idle_seconds = seconds_between(last_sampled_, t_launch);
    const Tensor all_logits = logits_.view();
    // A pure decode with graphs: its rows prepared now, perhaps sampled inside the graph.
    const std::unique_ptr<GraphSampling> gs = prepare_graph_sampling(plan, batch, {});
    executor_.launch([&] { run_forward(batch, logits, all_logits, fo, gs.get()); });
    executor_.wait();
    std::vector<SamplingRow> rows;
    // Verify rows see the output as it would be with the drafts before them accepted: their
    // step counter (the uniform's index), min_tokens and penalties (rebuilt, without a state key)
    // are those plain decoding would use at that output position.
    std::vector<std::vector<int32_t>> draft_outputs;
    size_t n_draft_rows = 0;
    for (const ScheduledSeq& e : plan.seqs) n_draft_rows += e.sample ? size_t(e.num_draft) : 0;
    draft_outputs.reserve(n_draft_rows);
    for (const ScheduledSeq& e : plan.seqs) {
      for (int i = 0; i < e.num_tokens - e.num_draft; ++i)
        if (e.start + i < int(e.seq->prompt.size())) ++counters_.prompt_tokens_total;
      if (!e.sample) continue;
      Sequence& s = *e.seq;
      emitted.push_back({&s, rows.size(), {}});
      const int eos = model_.config().eos_token_id;
      rows.push_back(
          {&s.params, &s.prompt, &s.output, s.seed, eos, e.num_draft > 0 ? 0 : sampler_key(s)});
      for (int j = 1; j <= e.num_draft; ++j) {
        std::vector<int32_t> out = s.output;
        out.insert(out.end(), s.draft.begin(), s.draft.begin() + j);
        draft_outputs.push_back(std::move(out));
        rows.push_back({&s.params, &s.prompt, &draft_outputs.back(), s.seed, eos, 0});
      }
    }
    if (gs)
      finish_graph_sampling(*gs, logits, &results);  // the same rows, prepared before the launch
    else
      sampler_.sample(logits, rows, &results);
    last_sampled_ = Clock::now();
    std::vector<MtpDrafter::Kept> kept;
    size_t k = 0;
    for (const ScheduledSeq& e : plan.seqs) {
      std::vector<int32_t> targets;
      Emitted* em = nullptr;
      if (e.sample) {
        em = &emitted[k++];
        for (int j = 0; j <= e.num_draft; ++j) targets.push_back(results[em->first_row + j].token);
        const std::span<const int32_t> drafts(e.seq->draft.data(), size_t(e.num_draft));
        em->tokens = verify_drafts(drafts, targets);
        if (e.num_draft > 0) {
          ++counters_.spec_verifies;
          counters_.spec_draft_tokens += e.num_draft;
          counters_.spec_accepted_tokens += int64_t(em->tokens.size()) - 1;
        }
      }
      if (!drafter_ || e.seq->finished()) continue;
      // The positions whose main entries stay, and the token after each (known, then emitted).
      MtpDrafter::Kept kp;
      kp.seq = e.seq;
      kp.start = e.start;
      kp.row = batch.attn.query_start_loc.ptr<int32_t>()[&e - plan.seqs.data()];
      kp.propose = e.sample;
      const int n_keep = e.num_tokens - e.num_draft + (em ? int(em->tokens.size()) - 1 : 0);
      const int known = e.seq->num_tokens();
      for (int p = e.start + 1; p <= e.start + n_keep; ++p)
        kp.next_tokens.push_back(p < known ? e.seq->token(p) : em->tokens[size_t(p - known)]);
      kept.push_back(std::move(kp));
    }
    std::vector<int32_t> first_drafts;
    if (drafter_) first_drafts = drafter_->catch_up(kept, cache_);
    std::vector<std::vector<int32_t>> tokens;
    std::vector<size_t> before;  // output length before commit
    for (Emitted& em : emitted) {
      tokens.push_back(em.tokens);
      before.push_back(em.seq->output.size());
    }
    scheduler_.commit_verified(plan, tokens);
    for (size_t i = 0; i < kept.size(); ++i) {
      Sequence* s = const_cast<Sequence*>(kept[i].seq);
      if (kept[i].propose && !s->finished()) s->draft = {first_drafts[i]};
    }
    // What commit appended: the emitted tokens up to the first that finished the sequence.
    for (size_t i = 0; i < emitted.size(); ++i) {
      emitted[i].tokens.resize(emitted[i].seq->output.size() - before[i]);
      counters_.generation_tokens_total += int64_t(emitted[i].tokens.size());
    }
    ++counters_.steps;
  }
  emit_tokens(emitted, results);
  counters_.last_step_seconds = seconds_between(t0, Clock::now());
  if (!plan.empty()) {
    record.seconds = counters_.last_step_seconds;
    record.comm_seconds = model_.comm_seconds() - comm0;
    record_step(record, shape);
  }
  std::vector<RequestOutput> outputs = collect_outputs();
  device_waiting_ = !plan.empty() ? has_unfinished() : device_waiting_ && has_unfinished();
  return outputs;
}

std::vector<RequestOutput> Engine::step_async() {
  const auto t0 = Clock::now();
  std::optional<Launched> next;
  StepInputs* inputs = nullptr;
  const ForwardBatch* batch = nullptr;
  if (StepPlan plan = scheduler_.schedule(); !plan.empty()) {
    next.emplace();
    next->plan = std::move(plan);
    next->shape = step_shape(next->plan);
    next->record.predicted_seconds = step_model_.predict(next->shape);
    inputs = inputs_[next_inputs_].get();
    batch = &inputs->build(next->plan);
  }
  auto t_resume = Clock::now();  // the host's part after the wait starts here
  const double build_seconds = seconds_between(t0, t_resume);
  // The launch follows the wait for the step in flight: the worker stays awake for it (on CUDA,
  // where its job ended once the kernels were queued and it would sleep through the device's step;
  // its wake-up was the idle gap between steps). On the CPU the worker computes the step itself,
  // and spinning through the engine's sampling would take a core from it.
  if (next && in_flight_ && model_.device() == Device::CUDA) executor_.expect_launch();
  std::vector<SampleResult> results;
  if (in_flight_) {
    sample_launched(*in_flight_, &results);
    t_resume = Clock::now();
  }
  if (next) {
    // The in-flight step's token of each sequence that has one (sorted by sequence).
    std::vector<std::pair<const Sequence*, int32_t>> pending_tokens;
    // The pending inputs are the tokens the step just sampled (one step in flight at most).
    if (!inputs->pending_inputs().empty()) {
      OSPREY_CHECK(in_flight_, "pending inputs without a step in flight");
      // The sampled rows of the step in flight by sequence (sorted for the look-ups).
      std::vector<std::pair<const Sequence*, size_t>> row_of;
      for (const ScheduledSeq& e : in_flight_->plan.seqs)
        if (e.sample) row_of.emplace_back(e.seq, row_of.size());
      std::sort(row_of.begin(), row_of.end());
      for (const StepInputs::PendingInput& p : inputs->pending_inputs()) {
        const auto it = std::lower_bound(row_of.begin(), row_of.end(),
                                         std::pair<const Sequence*, size_t>(p.seq, 0));
        OSPREY_CHECK(it != row_of.end() && it->first == p.seq && p.seq->num_pending == 1,
                     "sequence ", p.seq->id,
                     ": a pending input the step in flight does not sample");
        inputs->set_token(p.token_index, results[it->second].token);
        pending_tokens.emplace_back(p.seq, results[it->second].token);
      }
      std::sort(pending_tokens.begin(), pending_tokens.end());
    }
    scheduler_.launch(next->plan);
    const int64_t vocab = model_.config().vocab_size;
    if (const int64_t need = logits_rows(next->plan, *batch);
        logits_.empty() || logits_.view().size(0) < need)
      logits_ = Storage(model_.device(), DType::F32, {need, vocab});
    const Tensor logits = logits_.view().rows(0, next->plan.num_sampled);
    next->follows = in_flight_.has_value() || device_waiting_;
    next->prev_sampled = last_sampled_;
    const Tensor all_logits = logits_.view();
    // A pure decode with graphs: its rows prepared now (the in-flight step's tokens counted as
    // committed: the rows are those the sampling after N's commit would build), perhaps sampled
    // inside the graph.
    next->graph_sampling = prepare_graph_sampling(next->plan, *batch, pending_tokens);
    GraphSampling* gs = next->graph_sampling.get();
    executor_.launch(
        [this, batch, logits, all_logits, gs] { run_forward(*batch, logits, all_logits, {}, gs); });
    next->record.host_seconds = build_seconds + seconds_between(t_resume, Clock::now());
    next_inputs_ ^= 1;
  }
  if (in_flight_) {
    commit_launched(*in_flight_, results);
    retired_.clear();  // nothing launched later names a finished sequence
  }
  in_flight_ = std::move(next);
  std::vector<RequestOutput> outputs = collect_outputs();
  if (in_flight_ && live_.empty()) {
    // Every sequence of the step in flight is done: its tokens would all be dropped.
    executor_.wait();
    in_flight_.reset();
    retired_.clear();
  }
  device_waiting_ = in_flight_.has_value() || (device_waiting_ && has_unfinished());
  return outputs;
}

void Engine::sample_launched(Launched& l, std::vector<SampleResult>* results) {
  executor_.wait();
  const auto t0 = Clock::now();
  if (l.follows)
    l.record.device_idle_seconds =
        std::max(0.0, seconds_between(l.prev_sampled, executor_.started()));
  const Tensor logits = logits_.view().rows(0, l.plan.num_sampled);
  if (l.graph_sampling) {
    // Prepared at the launch (a sequence finished since then keeps its state key: its token is
    // dropped, and its slot is released with it).
    finish_graph_sampling(*l.graph_sampling, logits, results);
  } else {
    std::vector<SamplingRow> rows;
    const int eos = model_.config().eos_token_id;
    for (const ScheduledSeq& e : l.plan.seqs) {
      if (!e.sample) continue;
      const Sequence& s = *e.seq;
      // A sequence finished since the launch is sampled without state (its token is dropped).
      rows.push_back(
          {&s.params, &s.prompt, &s.output, s.seed, eos, s.finished() ? 0 : sampler_key(s)});
    }
    sampler_.sample(logits, rows, results);
  }
  last_sampled_ = Clock::now();
  l.sample_seconds = seconds_between(t0, last_sampled_);
  l.record.seconds = seconds_between(executor_.started(), executor_.finished()) + l.sample_seconds;
}

void Engine::commit_launched(Launched& l, const std::vector<SampleResult>& results) {
  std::vector<Emitted> emitted;
  std::vector<int32_t> sampled;
  std::vector<size_t> before;  // output length before commit
  for (const ScheduledSeq& e : l.plan.seqs) {
    for (int i = 0; i < e.num_tokens; ++i)
      if (e.start + i < int(e.seq->prompt.size())) ++counters_.prompt_tokens_total;
    if (!e.sample) continue;
    if (e.seq->finished()) ++counters_.async_discarded_tokens;
    emitted.push_back({e.seq, sampled.size(), {results[sampled.size()].token}});
    before.push_back(e.seq->output.size());
    sampled.push_back(results[sampled.size()].token);
  }
  scheduler_.commit(l.plan, sampled);
  for (size_t i = 0; i < emitted.size(); ++i) {
    emitted[i].tokens.resize(emitted[i].seq->output.size() - before[i]);
    counters_.generation_tokens_total += int64_t(emitted[i].tokens.size());
  }
  ++counters_.steps;
  emit_tokens(emitted, results);
  counters_.last_step_seconds = l.record.seconds;
  record_step(l.record, l.shape);
}

void Engine::emit_tokens(const std::vector<Emitted>& emitted,
                         const std::vector<SampleResult>& results) {
  for (const Emitted& em : emitted) {
    if (em.tokens.empty()) continue;
    Live& l = live_.at(em.seq->id);
    for (size_t j = 0; j < em.tokens.size(); ++j) {
      const bool last = j + 1 == em.tokens.size();
      const bool stop_string =
          on_token(l, &results[em.first_row + j], em.tokens[j], last && l.seq->finished());
      if (!last && stop_string) {
        // A stop string ended it: the later tokens of this verify are not output.
        l.seq->output.resize(l.seq->output.size() - (em.tokens.size() - j - 1));
        break;
      }
    }
  }
}

void Engine::record_step(StepRecord record, const StepShape& shape) {
  step_model_.calibrate(shape, record.seconds);
  record.num_decodes = int(shape.decode_contexts.size());
  for (int64_t c : shape.decode_contexts) record.decode_context_tokens += c;
  record.num_chunks = int(shape.chunks.size());
  for (const PrefillChunk& c : shape.chunks) {
    record.prefill_tokens += c.tokens;
    record.prefill_start_tokens += c.start;
  }
  record.kind = record.num_chunks == 0    ? StepKind::Decode
                : record.num_decodes == 0 ? StepKind::Prefill
                                          : StepKind::Mixed;
  counters_.last_step = record;
}

std::vector<RequestOutput> Engine::collect_outputs() {
  std::vector<RequestOutput> outputs;
  for (auto it = live_.begin(); it != live_.end();) {
    Live& l = it->second;
    if (!l.pending.new_tokens.empty() || l.seq->finished()) outputs.push_back(take_output(l));
    if (l.seq->finished()) {
      counters_.num_preemptions += l.seq->num_preemptions;
      sampler_.release(sampler_key(*l.seq));
      if (drafter_) drafter_->release(*l.seq);
      if (in_flight_) retired_.push_back(std::move(l.seq));  // the step in flight may name it
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  return outputs;
}

std::vector<Engine::Result> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                             const std::vector<SamplingParams>& params) {
  OSPREY_CHECK(prompts.size() == params.size(), "one SamplingParams per prompt");
  std::map<uint64_t, size_t> index;
  uint64_t next_id = 1ull << 62;  // clear of ids an AsyncEngine would hand out
  for (size_t i = 0; i < prompts.size(); ++i) {
    while (live_.count(next_id)) ++next_id;
    add_request(next_id, prompts[i], params[i]);
    index[next_id++] = i;
  }
  std::vector<Result> results(prompts.size());
  size_t done = 0;
  while (done < prompts.size()) {
    for (RequestOutput& o : step()) {
      auto it = index.find(o.id);
      if (it == index.end()) continue;
      Result& r = results[it->second];
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      r.text += o.text;
      if (o.finished) {
        r.finish_reason = o.finish_reason;
        ++done;
      }
    }
  }
  return results;
}

EngineStats Engine::stats() const {
  EngineStats s = counters_;
  s.num_running = int(scheduler_.num_running());
  s.num_waiting = int(scheduler_.num_waiting());
  s.kv_blocks_total = pool_.n_blocks();
  s.kv_blocks_used = pool_.n_held();
  s.prefix_query_tokens = pool_.query_tokens;
  s.prefix_hit_tokens = pool_.hit_tokens;
  s.async_worker_wakeups = executor_.sleeping_handovers();
  for (const auto& [id, l] : live_) s.num_preemptions += l.seq->num_preemptions;
  if (graphs_) {
    s.cuda_graph_replays = graphs_->replays();
    s.cuda_graph_captures = graphs_->captures();
    s.cuda_graph_capture_failures = graphs_->capture_failures();
    s.cuda_graph_eager_steps = graphs_->eager_reasons();
    s.cuda_graph_sampled_steps = graphs_->graph_sampled_steps();
    s.cuda_graph_host_sampling_steps = graphs_->host_sampling_reasons();
  }
  return s;
}

}  // namespace osprey
