// osprey generate: greedy decoding from token ids on the CPU.
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "model/greedy.h"

namespace osprey::cli {
namespace {

struct Args {
  std::string model, tokens;
  int max_tokens = 16;
  bool ignore_eos = false;
};

void run(const Args& a) {
  if (a.max_tokens < 1) fail("--max-tokens must be at least 1");
  auto m = load_model_cpu(a.model);
  const std::vector<int32_t> ids = parse_token_ids(a.tokens, m->config().vocab_size);
  GreedyOptions o;
  o.max_new_tokens = a.max_tokens;
  o.stop_at_eos = !a.ignore_eos;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> out = greedy_generate(*m, ids, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "%zu prompt + %zu generated tokens in %.3f s\n", ids.size(), out.size(), s);
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("generate", "greedy decoding from token ids (CPU)");
  sub->add_option("--model", args->model, "model folder")->required();
  sub->add_option("--tokens", args->tokens, "comma-separated prompt token ids")->required();
  sub->add_option("--max-tokens", args->max_tokens, "tokens to generate");
  sub->add_flag("--ignore-eos", args->ignore_eos, "keep going past the end-of-sequence token");
  sub->callback([args] { run(*args); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
