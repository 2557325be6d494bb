#include "model/rank_group.h"

#include <cstdio>

#include "dist/local_ranks.h"
#include "dist/nccl_comm.h"
#include "model/safetensors.h"
#include "model/shard.h"

namespace osprey {

namespace {
std::unique_ptr<DeepseekModel> load_shard(const std::string& dir, const ModelConfig& c,
                                          const RankShard& s, const RankGroupOptions& o) {
  const std::vector<WeightSpec> specs = shard_weight_specs(c, s);
  const std::string label = str_cat("osprey: rank ", s.rank, "/", s.world, " loading weights");
  ModelWeights w;
  if (o.dummy_weights) {
    w = make_dummy_weights_cuda(c, o.dummy_seed, c.quant.fp8, specs);
  } else {
    Checkpoint ck(dir);
    w = o.device == Device::CPU ? load_weights_cpu(ck, c, specs, label)
                                : load_weights_cuda(ck, c, specs, label);
  }
  return std::make_unique<DeepseekModel>(c, std::move(w));
}
}  // namespace

RankGroup::RankGroup(const std::string& dir, const dist::ParallelConfig& p,
                     const RankGroupOptions& o) {
  p.validate();
  const ModelConfig c = o.config ? *o.config : ModelConfig::from_file(dir);
  make_rank_shard(c, p, 0);  // the sizes' errors, before any thread or connection
  const int world = p.world_size(), local = p.ranks_per_node();
  first_rank_ = p.first_local_rank();
  if (o.device == Device::CUDA && local != 1)
    fail("on CUDA every rank is its own process: launch ", world,
         " processes (osprey does this "
         "itself for --tensor-parallel-size / --data-parallel-size on one node)");
  if (o.dummy_weights && o.device != Device::CUDA)
    fail("--load-format dummy with a parallel model needs --device cuda");
  control_ = dist::make_local_control_ranks(p, o.device);
  if (o.device == Device::CUDA) data_.push_back(dist::make_nccl_communicator(*control_[0]));
  models_.resize(size_t(local));
  errors_.resize(size_t(local));
  if (first_rank_ == 0) publisher_ = std::make_unique<StepPublisher>(*control_[0]);
  for (int i = first_rank_ == 0 ? 1 : 0; i < local; ++i)
    threads_.emplace_back([this, i, dir, p, o] { run_rank(i, dir, p, o); });
  if (first_rank_ != 0) return;
  // Rank 0 loads here, then waits for every rank to have loaded.
  try {
    const RankShard s = make_rank_shard(c, p, 0);
    models_[0] = load_shard(dir, c, s, o);
    dist::Communicator* data = data_.empty() ? control_[0].get() : data_[0].get();
    models_[0]->set_parallel(s, data, publisher_.get());
    control_[0]->barrier();
    std::fprintf(stderr, "osprey: %s, %d ranks (%s): every rank loaded\n", p.describe().c_str(),
                 world, control_[0]->backend());
  } catch (const std::exception& e) {
    control_[0]->abort(e.what());
    stopped_ = true;
    for (auto& t : threads_) t.join();
    throw;
  }
  leader_ = models_[0].get();
}

void RankGroup::run_rank(int i, const std::string& dir, const dist::ParallelConfig& p,
                         const RankGroupOptions& o) {
  dist::Communicator& control = *control_[size_t(i)];
  try {
    const ModelConfig c = o.config ? *o.config : ModelConfig::from_file(dir);
    const RankShard s = make_rank_shard(c, p, first_rank_ + i);
    models_[size_t(i)] = load_shard(dir, c, s, o);
    dist::Communicator* data = data_.empty() ? &control : data_[0].get();
    models_[size_t(i)]->set_parallel(s, data, nullptr);
    control.barrier();
    run_lockstep_worker(*models_[size_t(i)], control);
  } catch (const std::exception& e) {
    errors_[size_t(i)] = e.what();
    control.abort(e.what());
    if (!data_.empty()) data_[0]->abort(e.what());
  }
}

void RankGroup::serve_until_stopped() {
  for (auto& t : threads_) t.join();
  threads_.clear();
  stopped_ = true;
  for (size_t i = 0; i < errors_.size(); ++i)
    if (!errors_[i].empty()) fail(errors_[i]);
}

RankGroup::~RankGroup() {
  if (!stopped_ && publisher_) {
    try {
      publisher_->stop();
    } catch (const std::exception& e) {
      // A rank that failed or hangs: its thread may never return; leave it to the process's end.
      std::fprintf(stderr, "osprey: stopping the ranks: %s\n", e.what());
      for (auto& t : threads_) t.detach();
      threads_.clear();
    }
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

}  // namespace osprey
