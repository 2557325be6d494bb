#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace osprey {

TokenBudgetPolicy parse_token_budget_policy(const std::string& name) {
  if (name == "fixed") return TokenBudgetPolicy::Fixed;
  if (name == "step-time") return TokenBudgetPolicy::StepTime;
  fail("--token-budget-policy must be fixed or step-time, got '", name, "'");
}

StepShape step_shape(const StepPlan& plan) {
  StepShape shape;
  for (const ScheduledSeq& e : plan.seqs) {
    if (e.num_tokens == 1 && e.sample)
      shape.decode_contexts.push_back(e.start + 1);
    else
      shape.chunks.push_back({e.start, e.num_tokens});
  }
  return shape;
}

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockPool& pool, const StepTimeModel* step_model)
    : cfg_(cfg), pool_(pool), step_model_(step_model) {
  OSPREY_CHECK(cfg.max_num_seqs > 0 && cfg.max_num_batched_tokens > 0 && cfg.block_size > 0,
               "scheduler budgets must be positive");
  OSPREY_CHECK(cfg.token_budget_policy != TokenBudgetPolicy::StepTime || step_model,
               "the step-time token budget needs a step-time model");
}

int Scheduler::prefill_token_cap(const std::vector<Sequence*>& order) const {
  const int all = cfg_.max_num_batched_tokens;
  if (cfg_.token_budget_policy == TokenBudgetPolicy::Fixed) return all;
  std::vector<int64_t> decodes;  // contexts (cached + the new token)
  int64_t chunk_start = -1;      // where the first prompt chunk would start
  for (const Sequence* s : order) {
    if (s->num_tokens() - s->num_computed == 1)
      decodes.push_back(s->num_tokens());
    else if (chunk_start < 0)
      chunk_start = s->num_computed;
  }
  if (chunk_start < 0) chunk_start = waiting_.empty() ? 0 : waiting_.front()->num_computed;
  const int room = all - int(decodes.size());
  if (room <= 0) return 0;
  double target = cfg_.target_step_s;
  if (target <= 0 && !decodes.empty()) {
    int64_t sum = 0;
    for (int64_t c : decodes) sum += c;
    StepShape full;
    full.decode_contexts.assign(size_t(cfg_.max_num_seqs), sum / int64_t(decodes.size()));
    target = kAutoTargetFactor * step_model_->predict(full);
  }
  return step_model_->prefill_budget(decodes, chunk_start, std::min(cfg_.block_size, room), room,
                                     cfg_.block_size, target);
}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::Waiting;
  waiting_.push_back(seq);
}

bool Scheduler::grow(Sequence* s, int tokens) {
  const int need = blocks_needed(tokens) - int(s->blocks.size());
  if (need <= 0) return true;
  if (!pool_.can_allocate(need)) return false;
  for (int i = 0; i < need; ++i) s->blocks.push_back(pool_.allocate());
  return true;
}

void Scheduler::remove_running(Sequence* s) {
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
}

void Scheduler::preempt(Sequence* s) {
  pool_.release(s->blocks);
  s->blocks.clear();
  s->draft.clear();  // its MTP state is recomputed with the prompt
  s->hashes.clear();
  s->num_computed = 0;
  ++s->blocks_epoch;
  ++s->num_preemptions;
  s->status = SeqStatus::Waiting;
  remove_running(s);
  waiting_.push_front(s);
}

void Scheduler::admit_prefix(Sequence* s) {
  if (!cfg_.enable_prefix_caching || !s->blocks.empty()) return;
  const int bs = cfg_.block_size;
  const int max_blocks = (s->num_tokens() - 1) / bs;  // leave a token to compute for the logits
  std::vector<int32_t> toks(static_cast<size_t>(bs));
  BlockHash parent = 0;
  for (int i = 0; i < max_blocks; ++i) {
    for (int j = 0; j < bs; ++j) toks[size_t(j)] = s->token(i * bs + j);
    const BlockHash h = hash_block(parent, toks);
    const auto b = pool_.lookup(h);
    if (!b) break;
    pool_.acquire_cached(*b);
    s->blocks.push_back(*b);
    s->hashes.push_back(h);
    parent = h;
  }
  s->num_computed = int(s->blocks.size()) * bs;
  s->num_prefix_hit_tokens = s->num_computed;
  pool_.query_tokens += s->num_tokens();
  pool_.hit_tokens += s->num_computed;
}

void Scheduler::cache_full_blocks(Sequence* s) {
  if (!cfg_.enable_prefix_caching) return;
  const int bs = cfg_.block_size;
  std::vector<int32_t> toks(static_cast<size_t>(bs));
  const int upto = std::min(s->num_computed, s->num_known());
  for (size_t i = s->hashes.size(); int(i + 1) * bs <= upto; ++i) {
    for (int j = 0; j < bs; ++j) toks[size_t(j)] = s->token(int(i) * bs + j);
    const BlockHash h = hash_block(i ? s->hashes[i - 1] : 0, toks);
    pool_.register_cached(s->blocks[i], h);
    s->hashes.push_back(h);
  }
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int budget = cfg_.max_num_batched_tokens;
  auto add = [&](Sequence* s, int n, int n_draft) {
    const bool sample = s->num_computed + n - n_draft == s->num_tokens();
    plan.seqs.push_back({s, s->num_computed, n, sample, n_draft});
    plan.num_tokens += n;
    plan.num_sampled += sample ? 1 + n_draft : 0;
    budget -= n;
  };
  // Drafts a decode of s verifies with `budget` tokens left: within the step budget, the model
  // length (the last verified position stays below max_model_len) and max_tokens (1 + drafts
  // tokens can come out).
  auto drafts_for = [&](const Sequence* s) {
    if (cfg_.num_speculative_tokens <= 0 || s->num_tokens() - s->num_computed != 1) return 0;
    const int room_len = cfg_.max_model_len - s->num_tokens();
    const int room_out = s->params.max_tokens - int(s->output.size()) - 1;
    if (s->draft.empty()) return 0;  // nothing proposed (yet): a plain decode
    return std::max(0, std::min({cfg_.num_speculative_tokens, budget - 1, room_len, room_out}));
  };

  // 1. Running sequences: decodes first, then prefill chunks, each group in admission order.
  std::vector<Sequence*> order = running_;
  std::stable_partition(order.begin(), order.end(),
                        [](Sequence* s) { return s->num_tokens() - s->num_computed == 1; });
  std::vector<Sequence*> scheduled;
  bool preempted = false;
  int prefill_left = prefill_token_cap(order);
  for (Sequence* s : order) {
    if (s->status != SeqStatus::Running) continue;  // preempted earlier in this loop
    if (budget <= 0) break;
    if (s->num_pending > 0 && (int(s->output.size()) + s->num_pending >= s->params.max_tokens ||
                               s->num_tokens() >= cfg_.max_model_len))
      continue;  // its pending token ends it by length (at commit)
    const int n_draft = drafts_for(s);
    const int left = s->num_tokens() - s->num_computed;
    const int n = std::min({left, budget, left == 1 ? budget : prefill_left}) + n_draft;
    if (n <= 0) continue;
    while (!grow(s, s->num_computed + n)) {
      // Preempt the most recently admitted running sequence not yet scheduled (possibly s).
      Sequence* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it)
        if (std::find(scheduled.begin(), scheduled.end(), *it) == scheduled.end()) {
          victim = *it;
          break;
        }
      OSPREY_CHECK(victim, "nothing to preempt");
      preempt(victim);
      preempted = true;
      if (victim == s) break;
    }
    if (s->status != SeqStatus::Running) continue;
    add(s, n, n_draft);
    if (left != 1) prefill_left -= n;
    scheduled.push_back(s);
  }

  // 2. Waiting sequences, FCFS, while there is room (not in a step that had to preempt).
  while (!preempted && !waiting_.empty() && budget > 0 && prefill_left > 0 &&
         int(running_.size()) < cfg_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (s->num_pending > 0) break;  // preempted while its token is sampled: after commit
    admit_prefix(s);
    const int n = std::min({s->num_tokens() - s->num_computed, budget, prefill_left});
    if (!grow(s, s->num_computed + n)) {
      pool_.release(s->blocks);  // give back the prefix blocks; try again next step
      s->blocks.clear();
      s->hashes.clear();
      s->num_computed = 0;
      break;
    }
    waiting_.pop_front();
    s->status = SeqStatus::Running;
    running_.push_back(s);
    add(s, n, 0);
    prefill_left -= n;
  }
  return plan;
}

void Scheduler::launch(StepPlan& plan) {
  OSPREY_CHECK(!plan.launched, "the plan was launched already");
  for (const ScheduledSeq& e : plan.seqs) {
    OSPREY_CHECK(e.num_draft == 0, "async scheduling does not verify drafts");
    e.seq->num_computed = e.start + e.num_tokens;
    if (e.sample) ++e.seq->num_pending;
  }
  plan.launched = true;
}

std::vector<Sequence*> Scheduler::commit(const StepPlan& plan,
                                         const std::vector<int32_t>& sampled) {
  OSPREY_CHECK(int(sampled.size()) == plan.num_sampled, "sampled ", sampled.size(), " tokens for ",
               plan.num_sampled, " rows");
  std::vector<std::vector<int32_t>> emitted;
  for (int32_t t : sampled) emitted.push_back({t});
  return commit_verified(plan, emitted);
}

std::vector<Sequence*> Scheduler::commit_verified(
    const StepPlan& plan, const std::vector<std::vector<int32_t>>& emitted) {
  std::vector<Sequence*> done;
  size_t k = 0;
  for (const ScheduledSeq& e : plan.seqs) {
    Sequence* s = e.seq;
    const std::vector<int32_t>* toks = nullptr;
    if (e.sample) {
      OSPREY_CHECK(k < emitted.size(), "tokens for ", emitted.size(), " sampled entries only");
      toks = &emitted[k++];
      OSPREY_CHECK(!toks->empty() && int(toks->size()) <= 1 + e.num_draft, toks->size(),
                   " tokens emitted by an entry verifying ", e.num_draft, " drafts");
    }
    if (plan.launched && e.sample) {
      OSPREY_CHECK(s->num_pending > 0, "sequence ", s->id, " has no pending token to commit");
      --s->num_pending;
    }
    if (s->finished()) continue;  // aborted or stopped while the step ran: its tokens are dropped
    // Preempted while the (launched) step ran: its tokens stand, its cache entries are gone.
    const bool preempted = s->status == SeqStatus::Waiting;
    OSPREY_CHECK(!preempted || plan.launched, "sequence ", s->id, " preempted inside its step");
    s->draft.clear();
    if (!toks) {
      if (!preempted) {
        s->num_computed = std::max(s->num_computed, e.start + e.num_tokens);
        cache_full_blocks(s);
      }
      continue;
    }
    // The accepted drafts' cache entries are kept; the rejected ones' positions roll back.
    const int computed = e.start + e.num_tokens - e.num_draft + int(toks->size()) - 1;
    FinishReason r = FinishReason::None;
    for (int32_t tok : *toks) {
      s->output.push_back(tok);
      const SamplingParams& p = s->params;
      if (!p.ignore_eos && tok == cfg_.eos_token_id) {
        r = FinishReason::Stop;
      } else if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) !=
                 p.stop_token_ids.end()) {
        r = FinishReason::Stop;
      }
      if (r == FinishReason::Stop) s->stop_token = tok;
      if (r == FinishReason::None &&
          (int(s->output.size()) >= p.max_tokens || s->num_known() >= cfg_.max_model_len))
        r = FinishReason::Length;
      if (r != FinishReason::None) break;  // the tokens after it are dropped
    }
    if (!preempted) {
      // A launched plan's later steps may have counted further positions already (never fewer).
      s->num_computed = std::max(s->num_computed, std::min(computed, s->num_tokens()));
      cache_full_blocks(s);
    }
    if (r != FinishReason::None) {
      finish(s, r);
      done.push_back(s);
    }
  }
  OSPREY_CHECK(k == emitted.size(), "tokens for ", emitted.size(), " entries, ", k, " sampled");
  return done;
}

void Scheduler::finish(Sequence* s, FinishReason reason) {
  if (s->finished()) return;
  if (s->status == SeqStatus::Running)
    remove_running(s);
  else
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
  pool_.release(s->blocks);
  s->blocks.clear();
  ++s->blocks_epoch;
  s->status = SeqStatus::Finished;
  s->finish = reason;
}

}  // namespace osprey
