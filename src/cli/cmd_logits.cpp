// osprey logits: the logits of every position of a token sequence, written to a file
// (.npy or .safetensors), with a hash of them printed; optionally every named intermediate.
#include <xxhash.h>

#include <cstdio>

#include "cli/command.h"
#include "cli/parallel_flags.h"
#include "core/error.h"
#include "model/greedy.h"
#include "model/npy.h"
#include "model/safetensors_writer.h"

namespace osprey::cli {
namespace {

struct Args {
  std::string model, tokens, out = "logits.npy", dump, path = "auto";
  dist::ParallelConfig parallel;
};

AttentionPath parse_path(const std::string& p) {
  if (p == "auto") return AttentionPath::Auto;
  if (p == "expanded") return AttentionPath::Expanded;
  if (p == "absorbed") return AttentionPath::Absorbed;
  fail("--attention must be auto, expanded or absorbed, got '", p, "'");
}

void run(const Args& a) {
  std::unique_ptr<RankGroup> group;
  if (a.parallel.parallel()) group = std::make_unique<RankGroup>(a.model, a.parallel);
  if (serve_worker_ranks(group.get())) return;
  auto m = group ? group->take_leader() : load_model_cpu(a.model);
  if (group && !a.dump.empty()) fail("--dump is not supported with a parallel model");
  const std::vector<int32_t> ids = parse_token_ids(a.tokens, m->config().vocab_size);
  TensorDump dump;
  ForwardOptions o{parse_path(a.path), a.dump.empty() ? nullptr : &dump};
  Buffer logits = prefill_logits(*m, ids, o);
  if (a.out.size() >= 12 && a.out.substr(a.out.size() - 12) == ".safetensors")
    save_safetensors(a.out, {{"logits", logits.view()}});
  else
    save_npy(a.out, logits);
  if (!a.dump.empty()) dump.save(a.dump);
  const uint64_t h = XXH64(logits.view().data, logits.view().nbytes(), 0);
  const int64_t V = m->config().vocab_size, T = int64_t(ids.size());
  const float* last = logits.f32() + (T - 1) * V;
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (last[v] > last[best]) best = v;
  std::printf("logits [%lld, %lld] -> %s\nxxh64 %016llx\nargmax(last) %lld\n", (long long)T,
              (long long)V, a.out.c_str(), (unsigned long long)h, (long long)best);
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("logits", "logits of every position of a token sequence");
  sub->add_option("--model", args->model, "model folder")->required();
  sub->add_option("--tokens", args->tokens, "comma-separated token ids")->required();
  sub->add_option("--out", args->out, "output file (.npy or .safetensors)");
  sub->add_option("--dump", args->dump, "also write every named intermediate to this .safetensors");
  sub->add_option("--attention", args->path, "auto | expanded | absorbed");
  add_parallel_flags(sub, args->parallel);
  sub->callback([args] { run(*args); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
