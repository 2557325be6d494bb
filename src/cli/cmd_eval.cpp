// osprey eval --task arith|boxes|boxes-short: task accuracy, the gate every optimisation must
// pass (issues #7, #19). Greedy answers to the arithmetic word problems
// (tests/data/arith/test.jsonl) or to the long-context box problems (generated: eval/boxes_task.h;
// 3,000-8,000-token prompts, ~2,500 for boxes-short), the final number extracted as lm-eval's
// GSM8K flexible-extract does, exact-match accuracy with its 95% Wilson interval, the failures to
// a JSONL file. The model runs here on the CPU engine (--model) or behind any OpenAI-compatible
// server (--server, /v1/chat/completions). The prompt is the one eval/arith_task.h describes (what
// tools/train_arith.py and tools/train_boxes.py train on).
//
// Negative controls (--model only; the gate must be able to fail): --zero-attention-layer L,
// --indexer-recent; and --dense, the sparsity-off figure (model/ablation.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/client.h"
#include "bench/url.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/model_paths.h"
#include "cli/offline_engine.h"
#include "cli/parallel_flags.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "engine/tokenizer_decoder.h"
#include "eval/arith_task.h"
#include "eval/boxes_task.h"
#include "kv/kv_cache_dtype.h"
#include "ops/gemm.h"
#include "server/metrics.h"

namespace osprey::cli {
namespace {

struct Args {
  dist::ParallelConfig parallel;
  std::string task, model, server, data, failures, write_problems;
  std::string report, chat_format = "auto", served_model, api_key, device = "cpu",
                      fp8_gemm = "w8a8", kv_cache_dtype = "auto", speculative_config, outputs;
  int limit = 0, max_tokens = 256, batch = 0, concurrency = 32;  // batch 0: the task's default
  int zero_attention_layer = -1;
  bool indexer_recent = false, dense = false, bf16_index_keys = false;
  CudaGraphFlags graphs;
};

constexpr int kArithDefaultBatch = 64, kBoxesDefaultBatch = 16;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --model, else $OSPREY_MODEL, else the task's bundled model (boxes: models/osprey-boxes, made by
// tools/train_boxes.py; arith: models/osprey-arith).
std::string task_model_dir(const Args& a) {
  eval::BoxesLength length{};
  const char* env = std::getenv("OSPREY_MODEL");
  if (!a.model.empty() || (env && *env) || !eval::parse_boxes_task(a.task, &length))
    return resolve_model_dir(a.model);
  if (!std::filesystem::exists(std::filesystem::path(OSPREY_BOXES_MODEL_DIR) / "config.json"))
    fail("the box task's model ", OSPREY_BOXES_MODEL_DIR,
         " is absent: train it with scripts/train_boxes_gpu.sh (tools/train_boxes.py), or give "
         "--model");
  return OSPREY_BOXES_MODEL_DIR;
}

// Sequences decoded together: --batch, else 64 for arith and 16 for the box tasks (their
// 8,000-token contexts: 16 of them keep the CPU engine's cache near 1 GiB).
int task_batch(const Args& a) {
  eval::BoxesLength length{};
  if (a.batch > 0) return a.batch;
  return eval::parse_boxes_task(a.task, &length) ? kBoxesDefaultBatch : kArithDefaultBatch;
}

std::vector<std::string> answer_offline(const Args& a, const std::vector<eval::ArithProblem>& ps,
                                        std::string* label, EngineStats* stats) {
  const std::string dir = task_model_dir(a);
  const int batch = task_batch(a);
  ModelBundleOptions bo;
  bo.chat_format = a.chat_format;
  bo.device = parse_device_flag(a.device);
  bo.parallel = a.parallel;
  ModelBundle b = load_model_bundle(dir, bo);
  if (serve_worker_ranks(b.group.get())) return {};
  if (!b.tokenizer) fail("model '", dir, "' has no tokenizer.json: eval needs text in and out");
  const ModelConfig& c = b.model->config();
  if (a.bf16_index_keys) b.model->set_fp8_index_keys(false);
#ifdef OSPREY_WITH_CUDA
  ops::cuda::set_fp8_block_scaled(a.fp8_gemm == "w8a8");
#endif
  b.model->set_kv_cache_dtype(parse_kv_cache_dtype(a.kv_cache_dtype));
  ModelAblation ab;
  ab.zero_attention_layer = a.zero_attention_layer;
  ab.indexer_recent = a.indexer_recent;
  ab.dense_attention = a.dense;
  if (ab.zero_attention_layer < -1 || ab.zero_attention_layer >= c.num_hidden_layers)
    fail("--zero-attention-layer ", ab.zero_attention_layer, " is not a layer of '", dir, "' (0..",
         c.num_hidden_layers - 1, ")");
  if ((ab.indexer_recent || ab.dense_attention) && !c.has_indexer)
    fail("--indexer-recent and --dense need a model with the V3.2 indexer; '", dir, "' has none");
  if (ab.indexer_recent && ab.dense_attention)
    fail("--indexer-recent and --dense exclude each other");
  b.model->set_ablation(ab);
  *label = dir + " on " + a.device + (c.quant.fp8 ? " (FP8 weights)" : "") +
           (b.model->fp8_latent_cache() ? " (FP8 latent cache)" : "");

  std::vector<std::vector<int32_t>> prompts;
  size_t longest = 0;
  for (const auto& p : ps) {
    prompts.push_back(b.encode_chat({{"user", p.question}}, tokenizer::ChatOptions{}));
    longest = std::max(longest, prompts.back().size());
  }
  EngineConfig ec = offline_engine_config(c, batch, int64_t(longest), a.max_tokens);
  ec.enable_prefix_caching = false;  // every prompt differs after a few tokens
  ec.speculative = SpeculativeConfig::parse(a.speculative_config);
  ec.cuda_graph = use_cuda_graph(a.graphs, b.model->device(), b.model->parallel());
  ec.cuda_graph_capture_sizes = a.graphs.sizes;
  ec.max_num_batched_tokens =
      std::max(ec.max_num_batched_tokens, batch * (1 + ec.speculative.num_speculative_tokens));
  if (ec.speculative.enabled())
    *label += " (MTP, " + std::to_string(ec.speculative.num_speculative_tokens) + " draft tokens)";
  Engine e(*b.model, ec, make_text_decoder_factory(*b.tokenizer));
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_tokens = a.max_tokens;
  std::vector<std::string> outputs;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t chunk = size_t(batch) * 4;  // progress every few batches
  for (size_t i = 0; i < prompts.size(); i += chunk) {
    const size_t n = std::min(chunk, prompts.size() - i);
    std::vector<std::vector<int32_t>> part(prompts.begin() + int64_t(i),
                                           prompts.begin() + int64_t(i + n));
    for (Engine::Result& r : e.generate(part, std::vector<SamplingParams>(n, sp)))
      outputs.push_back(std::move(r.text));
    std::fprintf(stderr, "\r%zu/%zu problems answered (%.1f s)", outputs.size(), prompts.size(),
                 seconds_since(t0));
  }
  std::fprintf(stderr, "\n");
  *stats = e.stats();
  return outputs;
}

std::vector<std::string> answer_server(const Args& a, const std::vector<eval::ArithProblem>& ps,
                                       std::string* label) {
  bench::HttpTarget target{bench::parse_base_url(a.server), a.api_key};
  std::string model = a.served_model;
  if (model.empty()) {  // the server's first model
    const bench::HttpResponse r = bench::http_get(target, "/v1/models");
    if (r.status != 200) fail(a.server, "/v1/models answered ", r.status, ": give --served-model");
    try {
      model = nlohmann::json::parse(r.body).at("data").at(0).at("id").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      fail(a.server, "/v1/models: no model id in the answer (", e.what(), "): give --served-model");
    }
  }
  *label = a.server + " (" + model + ")";
  std::vector<bench::PlannedRequest> reqs;
  for (const auto& p : ps) {
    const nlohmann::json body = {{"model", model},
                                 {"messages", {{{"role", "user"}, {"content", p.question}}}},
                                 {"max_tokens", a.max_tokens},
                                 {"temperature", 0},
                                 {"stream", true},
                                 {"stream_options", {{"include_usage", true}}}};
    reqs.push_back({body.dump(), 0, a.max_tokens});
  }
  bench::RunOptions ro;
  ro.endpoint = "/v1/chat/completions";
  ro.send_times.assign(reqs.size(), 0.0);
  ro.max_concurrency = a.concurrency;
  ro.on_progress = [](size_t done, size_t total) {
    if (done % 50 == 0 || done == total)
      std::fprintf(stderr, "\r%zu/%zu problems answered", done, total);
  };
  const bench::RunOutcome out = bench::run_requests(target, reqs, ro);
  std::fprintf(stderr, "\n");
  std::vector<std::string> outputs;
  size_t failed = 0;
  for (const auto& r : out.results) {
    if (!r.success && failed++ == 0) std::fprintf(stderr, "request failed: %s\n", r.error.c_str());
    outputs.push_back(r.success ? r.generated_text : std::string());
  }
  if (failed == out.results.size()) fail("every request to ", a.server, " failed");
  if (failed) std::fprintf(stderr, "%zu requests failed (scored as wrong)\n", failed);
  return outputs;
}

// The task's problems: arith from --data (default tests/data/arith/test.jsonl); boxes and
// boxes-short generated (the first --limit of the test split, kBoxesTestSize by default), or read
// from --data (a JSONL of tools/boxes/generate.py).
std::vector<eval::ArithProblem> task_problems(const Args& a) {
  eval::BoxesLength length{};
  const bool boxes = eval::parse_boxes_task(a.task, &length);
  if (!boxes && a.task != "arith")
    fail("unknown task '", a.task, "' (tasks: arith, boxes, boxes-short)");
  if (a.limit < 0) fail("--limit must be positive");
  if (!a.write_problems.empty() && (!boxes || !a.data.empty()))
    fail("--write-problems writes the generated problems of --task boxes or boxes-short");
  std::vector<eval::ArithProblem> ps;
  if (boxes && a.data.empty()) {
    const int64_t n = a.limit > 0 ? a.limit : eval::kBoxesTestSize;
    std::vector<eval::BoxesProblem> bs = eval::boxes_problems("test", length, n);
    if (!a.write_problems.empty()) eval::write_boxes_problems(bs, a.write_problems);
    for (eval::BoxesProblem& b : bs) ps.push_back(std::move(b.problem));
    return ps;
  }
  ps = eval::load_arith_problems(a.data.empty() ? std::string(OSPREY_DEFAULT_ARITH_DATA) : a.data);
  if (a.limit > 0 && size_t(a.limit) < ps.size()) ps.resize(size_t(a.limit));
  return ps;
}

void run(const Args& a) {
  parse_device_flag(a.device);  // fails early
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(a.kv_cache_dtype);
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative_config);  // fails early
  if (!a.server.empty() && spec.enabled())
    fail("--speculative-config acts on the model here: use --model (the server takes its own)");
  if (!a.server.empty() &&
      (a.device != "cpu" || a.bf16_index_keys || kv_dtype != KvCacheDtype::Auto))
    fail(
        "--device, --bf16-index-keys and --kv-cache-dtype act on the model here: use --model (the "
        "server takes its own --kv-cache-dtype)");
  if (a.fp8_gemm != "w8a8" && a.fp8_gemm != "w8a16")
    fail("--fp8-gemm must be w8a8 or w8a16, got '", a.fp8_gemm, "'");
  if (a.fp8_gemm != "w8a8" && a.device != "cuda")
    fail("--fp8-gemm applies to --device cuda (the CPU dequantises FP8 weights: w8a16 math)");
  if (a.bf16_index_keys && a.device != "cuda")
    fail("--bf16-index-keys applies to --device cuda (the CPU keeps the indexer keys in F32)");
  if (!a.model.empty() && !a.server.empty()) fail("give --model or --server, not both");
  if (a.max_tokens < 1 || a.batch < 0 || a.concurrency < 1)
    fail("--max-tokens, --batch and --concurrency must be at least 1");
  if (!a.server.empty() && (a.zero_attention_layer >= 0 || a.indexer_recent || a.dense))
    fail("--zero-attention-layer, --indexer-recent and --dense act on the model here: use --model");
  const std::vector<eval::ArithProblem> ps = task_problems(a);
  if (!a.write_problems.empty()) {
    std::printf("wrote %zu %s problems to %s\n", ps.size(), a.task.c_str(),
                a.write_problems.c_str());
    return;
  }
  const std::string failures = a.failures.empty() ? a.task + "_failures.jsonl" : a.failures;
  const auto t0 = std::chrono::steady_clock::now();
  std::string label;
  EngineStats stats;
  const std::vector<std::string> outputs =
      a.server.empty() ? answer_offline(a, ps, &label, &stats) : answer_server(a, ps, &label);
  const double secs = seconds_since(t0);
  const eval::EvalSummary s = eval::score_outputs(ps, outputs, failures);
  std::printf("%s: %s\n", a.task.c_str(), label.c_str());
  std::printf("accuracy %.4f (%lld/%lld), 95%% CI [%.4f, %.4f]; %lld without a number; %.1f s\n",
              s.accuracy, (long long)s.correct, (long long)s.n, s.ci95.lo, s.ci95.hi,
              (long long)s.invalid, secs);
  std::printf("failures: %s (%lld)\n", failures.c_str(), (long long)(s.n - s.correct));
  const double acceptance = server::spec_acceptance_rate(stats);
  const double accepted_length = server::spec_mean_accepted_length(stats);
  if (spec.enabled())
    std::printf(
        "speculative (mtp, %d draft tokens): %lld drafts verified, %lld accepted: acceptance "
        "rate %.4f, mean accepted length %.3f; %lld engine steps for %lld generated tokens\n",
        spec.num_speculative_tokens, (long long)stats.spec_draft_tokens,
        (long long)stats.spec_accepted_tokens, acceptance, accepted_length, (long long)stats.steps,
        (long long)stats.generation_tokens_total);
  if (stats.cuda_graph_replays + stats.cuda_graph_captures + stats.cuda_graph_capture_failures)
    std::printf("cuda graphs: %lld decode steps replayed, %lld captures, %lld failed captures; "
                "%lld engine steps\n",
                (long long)stats.cuda_graph_replays, (long long)stats.cuda_graph_captures,
                (long long)stats.cuda_graph_capture_failures, (long long)stats.steps);
  if (!a.outputs.empty()) {
    std::ofstream f(a.outputs);
    if (!f) fail("cannot write --outputs '", a.outputs, "'");
    for (size_t i = 0; i < outputs.size(); ++i)
      f << nlohmann::json{{"index", i}, {"output", outputs[i]}}.dump() << "\n";
  }
  if (!a.report.empty()) {
    std::ofstream f(a.report);
    if (!f) fail("cannot write the report '", a.report, "'");
    const nlohmann::json j = {
        {"task", a.task},
        {"target", label},
        {"data", a.data.empty() && a.task == "arith" ? std::string(OSPREY_DEFAULT_ARITH_DATA)
                 : a.data.empty()                    ? "generated (test split)"
                                                     : a.data},
        {"n", s.n},
        {"correct", s.correct},
        {"invalid", s.invalid},
        {"accuracy", s.accuracy},
        {"ci95", {s.ci95.lo, s.ci95.hi}},
        {"zero_attention_layer", a.zero_attention_layer},
        {"indexer_recent", a.indexer_recent},
        {"dense", a.dense},
        {"device", a.server.empty() ? a.device : "server"},
        {"bf16_index_keys", a.bf16_index_keys},
        {"fp8_gemm", a.fp8_gemm},
        {"kv_cache_dtype", a.kv_cache_dtype},
        {"seconds", secs},
        {"speculative_tokens", spec.num_speculative_tokens},
        {"spec_draft_tokens", stats.spec_draft_tokens},
        {"spec_accepted_tokens", stats.spec_accepted_tokens},
        {"spec_acceptance_rate", acceptance},
        {"spec_mean_accepted_length", accepted_length},
        {"engine_steps", stats.steps},
        {"generation_tokens", stats.generation_tokens_total}};
    f << j.dump(1) << "\n";
  }
}

void register_cmd(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "eval", "task accuracy: greedy answers scored exactly (--task arith|boxes)");
  sub->add_option("--task", a->task,
                  "the task: arith | boxes (long context, 3,000-8,000 tokens) | boxes-short "
                  "(~2,500 tokens)")
      ->required();
  sub->add_option("--model", a->model,
                  "model folder, run here (default: $OSPREY_MODEL or the bundled model)");
  sub->add_option("--device", a->device, "cpu | cuda: where --model runs (default cpu)");
  add_parallel_flags(sub, a->parallel);
  sub->add_option("--fp8-gemm", a->fp8_gemm,
                  "--device cuda, FP8 weights: w8a8 = cuBLASLt block-scaled FP8 with activations "
                  "quantized per 1x128 (default, where the shape allows) | w8a16 = weights "
                  "dequantised to BF16");
  sub->add_flag("--bf16-index-keys", a->bf16_index_keys,
                "--device cuda: the indexer key cache in BF16 instead of FP8 (the default)");
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "latent KV cache of --model: auto (default) | bf16 (--device cuda) | fp8 "
                  "(DeepSeek's fp8_ds_mla format)");
  sub->add_option("--server", a->server,
                  "an OpenAI-compatible server's base URL (http://host:port)");
  sub->add_option("--served-model", a->served_model,
                  "the model name sent to --server (default: its first in /v1/models)");
  sub->add_option("--api-key", a->api_key, "bearer token for --server");
  sub->add_option("--data", a->data,
                  "problems, JSONL (default: arith tests/data/arith/test.jsonl; boxes generated)");
  sub->add_option("--limit", a->limit,
                  "only the first N problems (boxes: N of the generated test split, default 200)");
  sub->add_option("--write-problems", a->write_problems,
                  "boxes: write the generated problems as JSONL here and stop");
  sub->add_option("--failures", a->failures,
                  "JSONL of the wrong answers (default TASK_failures.jsonl)");
  sub->add_option("--report", a->report, "also write the summary as JSON here");
  sub->add_option("--outputs", a->outputs,
                  "also write every answer's text as JSONL here (to compare two runs)");
  sub->add_option("--speculative-config", a->speculative_config,
                  "--model: speculative decoding, e.g. '{\"method\": \"mtp\", "
                  "\"num_speculative_tokens\": 2}' (the model's MTP layer drafts 1 to 3 tokens)");
  sub->add_option("--chat-format", a->chat_format,
                  "auto | deepseek-v3 | deepseek-v3.1 | simple (--model)");
  sub->add_option("--max-tokens", a->max_tokens, "tokens per answer at most (default 256)");
  sub->add_option("--batch", a->batch,
                  "sequences decoded together (--model; default 64, boxes 16)");
  sub->add_option("--concurrency", a->concurrency, "requests in flight (--server, default 32)");
  sub->add_option("--zero-attention-layer", a->zero_attention_layer,
                  "negative control: layer L's attention output set to zero");
  sub->add_flag("--indexer-recent", a->indexer_recent,
                "negative control: attend the most recent index_topk positions, not the indexer's");
  sub->add_flag("--dense", a->dense,
                "sparsity off: attend every causal position (index_topk above any sequence)");
  add_cuda_graph_flags(sub, a->graphs);
  sub->callback([a] { run(*a); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
