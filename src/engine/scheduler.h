// The scheduler: what runs in the next model step. Pure bookkeeping (no backend code).
//
// Each step, under a token budget (max_num_batched_tokens) and max_num_seqs:
//   1. running sequences, decodes first, then unfinished prefill chunks, each taking
//      min(remaining tokens, budget) — long prompts are prefilled in chunks across steps;
//   2. waiting sequences in arrival order (FCFS: the first that does not fit stops admission),
//      first reusing cached prefix blocks.
// When a running sequence needs a block and none is left, the most recently arrived running
// sequence is preempted by recompute: its blocks are released and it goes back to the front of the
// waiting queue with its generated tokens kept, to be prefilled again (mostly from the prefix
// cache) when room returns.
// Speculative decoding (num_speculative_tokens > 0): a decode whose sequence holds draft tokens
// also verifies up to that many of them in the same step (its query is 1 + num_draft tokens, all
// counted in the token budget, within max_model_len and max_tokens); commit_verified() then keeps
// the accepted prefix and rolls the rest back (num_computed stops after the last accepted token,
// so the rejected positions' cache entries are rewritten before anything reads them).
// Async scheduling (engine/engine.h): launch() marks a plan in flight before its tokens are
// known: its entries' positions count as computed and each sampled entry adds a pending token
// (Sequence::num_pending), so the next schedule() plans the decodes after them. A sequence whose
// pending tokens will end it by length is not scheduled again; one that ends otherwise (a stop
// token, a stop string, an abort) while a later step holds it is finished at commit and that
// step's token for it is dropped there. A sequence preempted while a launched step held it keeps
// that step's tokens (they are the true next tokens) and is recomputed from its prompt later.
// The token budget of prompt chunks follows SchedulerConfig::token_budget_policy: Fixed fills
// whatever max_num_batched_tokens leaves after the decodes (vLLM's chunked-prefill budget);
// StepTime caps the step's prompt tokens so its predicted time (engine/step_time_model.h) stays
// within target_step_s when decodes share the step (stall-free mixed chunks, as Sarathi-Serve and
// SGLang's mixed chunk do), never below one block of prompt tokens so prefill always progresses.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "engine/step_time_model.h"
#include "kv/block_pool.h"

namespace osprey {

enum class TokenBudgetPolicy { Fixed, StepTime };
// "fixed" | "step-time"; throws osprey::Error naming the choices for anything else.
TokenBudgetPolicy parse_token_budget_policy(const std::string& name);

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int block_size = 64;
  int max_model_len = 4096;
  bool enable_prefix_caching = true;
  int eos_token_id = -1;
  int num_speculative_tokens = 0;  // draft tokens a decode may verify per step (0: off)
  TokenBudgetPolicy token_budget_policy = TokenBudgetPolicy::Fixed;
  // StepTime: the predicted step time to keep mixed steps within; 0: kAutoTargetFactor × the
  // predicted decode-only step of max_num_seqs sequences at the running decodes' mean context.
  double target_step_s = 0;
};

// With target_step_s 0, mixed steps may take this many times a full decode-only step.
inline constexpr double kAutoTargetFactor = 2.0;

struct ScheduledSeq {
  Sequence* seq;
  int start;          // first token position computed this step
  int num_tokens;     // tokens computed this step
  bool sample;        // the chunk reaches the end of the known tokens: sample the next one
  int num_draft = 0;  // of num_tokens, draft tokens after the known ones (seq->draft's first)
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;  // decodes first, then prefills
  int num_tokens = 0;
  int num_sampled = 0;    // logit rows: 1 + num_draft per entry with sample
  bool launched = false;  // Scheduler::launch marked it in flight (async scheduling)
  bool empty() const { return seqs.empty(); }
};

// The plan as the step-time model sees it: one-token sampled entries are decodes (context
// start + 1), the rest prompt chunks.
StepShape step_shape(const StepPlan& plan);

class Scheduler {
 public:
  // step_model: required by TokenBudgetPolicy::StepTime (not owned; outlives the scheduler).
  Scheduler(const SchedulerConfig& cfg, BlockPool& pool, const StepTimeModel* step_model = nullptr);

  void add(Sequence* seq);
  StepPlan schedule();
  // Async scheduling: the plan runs now, its tokens arrive later (at commit). Its positions count
  // as computed and each sampled entry holds a pending token until commit. No drafts.
  void launch(StepPlan& plan);
  // After the step ran: the computed tokens enter the cache (full blocks become reusable
  // prefixes); sampled tokens are appended and stop conditions checked. `sampled` holds one token
  // per plan entry with sample == true, in plan order. Returns the sequences that finished.
  // A sequence finished since the plan was made gets nothing; one preempted since (a launched
  // plan) gets its tokens but keeps no cache entries.
  std::vector<Sequence*> commit(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // commit() for steps that verified drafts: emitted[i] holds the tokens the i-th entry with
  // sample == true produced (1 to 1 + num_draft: the accepted drafts, then the token sampled after
  // them), in plan order. Tokens after the first that finishes the sequence are dropped.
  std::vector<Sequence*> commit_verified(const StepPlan& plan,
                                         const std::vector<std::vector<int32_t>>& emitted);
  // Ends a sequence wherever it is (abort, a stop string): its blocks are released.
  void finish(Sequence* seq, FinishReason reason);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  int blocks_needed(int tokens) const { return (tokens + cfg_.block_size - 1) / cfg_.block_size; }
  bool grow(Sequence* s, int tokens);  // allocate blocks to hold `tokens`; false if none left
  void preempt(Sequence* s);
  void admit_prefix(Sequence* s);       // reuse cached blocks for a leading run of full blocks
  void cache_full_blocks(Sequence* s);  // the full blocks of known, computed tokens
  void remove_running(Sequence* s);
  // The prompt tokens this step may take (order: running, decodes first).
  int prefill_token_cap(const std::vector<Sequence*>& order) const;

  SchedulerConfig cfg_;
  BlockPool& pool_;
  const StepTimeModel* step_model_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
};

}  // namespace osprey
