// osprey generate: a prompt in, text streamed out (the engine on the CPU, with the model's
// tokenizer and chat format); or token ids in, greedy token ids out (--tokens).
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/model_paths.h"
#include "cli/offline_engine.h"
#include "cli/parallel_flags.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "engine/tokenizer_decoder.h"
#include "kv/kv_cache_dtype.h"
#include "model/greedy.h"
#include "server/metrics.h"

namespace osprey::cli {
namespace {

struct Args {
  std::string model, tokens, prompt, system, chat_format = "auto", kv_cache_dtype = "auto",
                                             speculative_config, device = "cpu";
  bool raw = false, thinking = false, ignore_eos = false;
  CudaGraphFlags graphs;
  int max_tokens = 256;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  int64_t seed = -1;
  dist::ParallelConfig parallel;
};

// The acceptance figures of a run with --speculative-config, to stderr.
void print_spec_stats(const SpeculativeConfig& spec, const EngineStats& st) {
  if (!spec.enabled()) return;
  std::fprintf(stderr,
               "[mtp, %d draft tokens: %lld of %lld drafts accepted (%.1f%%), mean accepted length "
               "%.2f, %lld steps]\n",
               spec.num_speculative_tokens, (long long)st.spec_accepted_tokens,
               (long long)st.spec_draft_tokens, 100.0 * server::spec_acceptance_rate(st),
               server::spec_mean_accepted_length(st), (long long)st.steps);
}

void run_tokens(const Args& a, const std::string& dir) {
  std::unique_ptr<RankGroup> group;
  if (a.parallel.parallel()) group = std::make_unique<RankGroup>(dir, a.parallel);
  if (serve_worker_ranks(group.get())) return;
  auto m = group ? group->take_leader() : load_model(dir, parse_device_flag(a.device));
  m->set_kv_cache_dtype(parse_kv_cache_dtype(a.kv_cache_dtype));
  const std::vector<int32_t> ids = parse_token_ids(a.tokens, m->config().vocab_size);
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative_config);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> out;
  EngineStats stats;
  const bool cuda_graph = use_cuda_graph(a.graphs, m->device(), m->parallel());
  if (spec.enabled() || cuda_graph) {
    // Through the engine (drafts verified by the model; decode steps as CUDA graph replays),
    // greedy like the plain path.
    EngineConfig ec = offline_engine_config(m->config(), 1, int64_t(ids.size()), a.max_tokens);
    ec.speculative = spec;
    ec.cuda_graph = cuda_graph;
    ec.cuda_graph_capture_sizes = a.graphs.sizes;
    Engine e(*m, ec);
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = a.max_tokens;
    p.ignore_eos = a.ignore_eos;
    out = e.generate({ids}, {p})[0].tokens;
    stats = e.stats();
  } else {
    GreedyOptions o;
    o.max_new_tokens = a.max_tokens;
    o.stop_at_eos = !a.ignore_eos;
    out = greedy_generate(*m, ids, o);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "%zu prompt + %zu generated tokens in %.3f s\n", ids.size(), out.size(), s);
  print_spec_stats(spec, stats);
}

void run_prompt(const Args& a, const std::string& dir) {
  ModelBundleOptions bo;
  bo.chat_format = a.chat_format;
  bo.parallel = a.parallel;
  ModelBundle b = load_model_bundle(dir, bo);
  if (serve_worker_ranks(b.group.get())) return;
  b.model->set_kv_cache_dtype(parse_kv_cache_dtype(a.kv_cache_dtype));
  std::vector<int32_t> prompt;
  if (a.raw) {
    prompt = b.encode_text(a.prompt);
  } else {
    std::vector<tokenizer::ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", a.prompt});
    tokenizer::ChatOptions co;
    co.thinking = a.thinking;
    prompt = b.encode_chat(msgs, co);
  }
  SamplingParams p;
  p.temperature = a.temperature;
  p.top_p = a.top_p;
  p.top_k = a.top_k;
  p.max_tokens = a.max_tokens;
  p.ignore_eos = a.ignore_eos;
  if (a.seed >= 0) p.seed = uint64_t(a.seed);
  EngineConfig ec =
      offline_engine_config(b.model->config(), 1, int64_t(prompt.size()), a.max_tokens);
  ec.speculative = SpeculativeConfig::parse(a.speculative_config);
  ec.cuda_graph = use_cuda_graph(a.graphs, b.model->device(), b.model->parallel());
  ec.cuda_graph_capture_sizes = a.graphs.sizes;
  Engine e(*b.model, ec, make_text_decoder_factory(*b.tokenizer));
  const auto t0 = std::chrono::steady_clock::now();
  e.add_request(1, prompt, p);
  RequestOutput last;
  while (e.has_unfinished())
    for (RequestOutput& o : e.step()) {
      std::fwrite(o.text.data(), 1, o.text.size(), stdout);
      std::fflush(stdout);
      last = o;
    }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "[%s: %zu prompt tokens, %d generated in %.3f s, finish: %s]\n", dir.c_str(),
               prompt.size(), last.completion_tokens, s, finish_reason_name(last.finish_reason));
  print_spec_stats(ec.speculative, e.stats());
}

void run(const Args& a) {
  if (a.max_tokens < 1) fail("--max-tokens must be at least 1");
  if (a.tokens.empty() == a.prompt.empty())
    fail("generate needs exactly one of --prompt or --tokens");
  const Device device = parse_device_flag(a.device);
  if (device == Device::CUDA && (a.tokens.empty() || a.parallel.parallel()))
    fail("--device cuda applies to --tokens on one GPU (serve runs text prompts on the GPU)");
  parse_kv_cache_dtype(a.kv_cache_dtype);  // a bad value fails before the model loads
  SpeculativeConfig::parse(a.speculative_config);
  const std::string dir = resolve_model_dir(a.model);
  if (!a.tokens.empty())
    run_tokens(a, dir);
  else
    run_prompt(a, dir);
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("generate", "generate text from a prompt (CPU)");
  sub->add_option("--model", args->model,
                  "model folder (default: $OSPREY_MODEL or the bundled model)");
  sub->add_option("--prompt", args->prompt, "the user message (chat-formatted unless --raw)");
  sub->add_option("--tokens", args->tokens, "comma-separated prompt token ids: greedy ids out");
  sub->add_option("--system", args->system, "a system message");
  sub->add_option("--device", args->device, "cpu (default) | cuda (with --tokens)");
  sub->add_option("--chat-format", args->chat_format,
                  "auto | deepseek-v3 | deepseek-v3.1 | simple");
  sub->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                  "latent KV cache: auto (default, F32) | fp8 (DeepSeek's fp8_ds_mla format)");
  sub->add_flag("--raw", args->raw, "encode the prompt as plain text, no chat format");
  sub->add_flag("--thinking", args->thinking, "thinking mode (deepseek-v3.1 format)");
  sub->add_option("--max-tokens", args->max_tokens,
                  "tokens to generate at most (default 256; EOS stops sooner)");
  sub->add_option("--temperature", args->temperature, "0 = greedy (default)");
  sub->add_option("--top-p", args->top_p, "nucleus sampling");
  sub->add_option("--top-k", args->top_k, "top-k sampling (0 = off)");
  sub->add_option("--seed", args->seed, "sampling seed");
  sub->add_flag("--ignore-eos", args->ignore_eos, "keep going past the end-of-sequence token");
  add_cuda_graph_flags(sub, args->graphs);
  sub->add_option("--speculative-config", args->speculative_config,
                  "speculative decoding, e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": "
                  "2}' (the model's MTP layer drafts 1 to 3 tokens; output unchanged)");
  add_parallel_flags(sub, args->parallel);
  sub->callback([args] { run(*args); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
