// osprey bench: benchmarks, one subcommand each. `bench serve` times an OpenAI-compatible server
// as `vllm bench serve` does. A new benchmark adds an add_<name>(CLI::App& bench) below and a
// call in register_cmd.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bench/comm.h"
#include "bench/kernels.h"
#include "bench/serve.h"
#include "bench/step.h"
#include "bench/url.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/parallel_flags.h"
#include "core/error.h"

namespace osprey::cli {
namespace {

struct ServeArgs {
  bench::ServeOptions o;
  std::string host;
  int port = 0;
  std::string request_rate = "inf";
  std::string preset;
  std::string percentiles = "99";
  std::string kv_cache_dtype = "auto";
};

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0' || !(v > 0))
    fail("--request-rate must be a positive number of requests per second or inf, got '", s, "'");
  return v;
}

// "1,4,16,inf": a sweep, one run per rate.
std::vector<double> parse_rates(const std::string& s) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(parse_rate(s.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

std::vector<double> parse_percentiles(const std::string& s) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v >= 0 && v <= 100))
      fail("--metric-percentiles must be comma-separated numbers in [0, 100], got '", s, "'");
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

void add_serve(CLI::App& bench) {
  auto a = std::make_shared<ServeArgs>();
  bench::ServeOptions& o = a->o;
  CLI::App* sub = bench.add_subcommand(
      "serve", "time an OpenAI-compatible server under load (like `vllm bench serve`)");
  sub->add_option("--base-url", o.base_url, "server URL")->capture_default_str();
  sub->add_option("--host", a->host, "server host (overrides --base-url's)");
  sub->add_option("--port", a->port, "server port (overrides --base-url's)");
  sub->add_option("--endpoint", o.endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  sub->add_option("--model", o.model, "served model name (default: the first of GET /v1/models)");
  sub->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json or its folder, for token-exact prompts (default: --model when "
                  "it is a folder with one; else approximate word prompts)");
  sub->add_option("--preset", a->preset,
                  "named workload: dsv32-5k = 5000 in / 500 out / 64 concurrent / 320 prompts; "
                  "explicit options override it");
  sub->add_option("--dataset", o.dataset, "random")->capture_default_str();
  auto* in = sub->add_option("--input-len", o.input_len, "prompt tokens")->capture_default_str();
  auto* out =
      sub->add_option("--output-len", o.output_len, "output tokens (max_tokens, ignore_eos)")
          ->capture_default_str();
  sub->add_option("--range-ratio", o.range_ratio, "lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str();
  auto* np =
      sub->add_option("--num-prompts", o.num_prompts, "requests to send")->capture_default_str();
  auto* mc = sub->add_option("--max-concurrency", o.max_concurrency,
                             "requests in flight at most (0: no limit)")
                 ->capture_default_str();
  sub->add_option("--request-rate", a->request_rate,
                  "requests per second, Poisson arrivals; inf sends all at once; a comma list "
                  "(1,4,16,inf) runs one benchmark per rate and prints a table of them")
      ->capture_default_str();
  sub->add_option("--burstiness", o.burstiness, "gamma shape of the arrival gaps (1: Poisson)")
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "random seed (prompts, lengths, arrivals)")
      ->capture_default_str();
  sub->add_option("--api-key", o.api_key, "bearer token (default: env OPENAI_API_KEY)");
  sub->add_option("--metric-percentiles", a->percentiles, "comma-separated percentiles to report")
      ->capture_default_str();
  sub->add_option("--extra-body", o.extra_body, "JSON object merged into every request body");
  sub->add_option("--request-timeout", o.request_timeout_s, "seconds before a request fails")
      ->capture_default_str();
  sub->add_option("--result-json", o.result_json, "write the metrics and per-request data here");
  sub->add_option("--plot", o.plot, "write a PNG of the TTFT and ITL distributions here");
  sub->add_flag("!--no-progress", o.progress, "no progress line on stderr");
  sub->add_option("--model-dir", o.model_dir,
                  "the served model's folder (config.json): the server's steps by kind are "
                  "printed beside their roofline, and the full 61-layer 4-GPU decode-step "
                  "estimate against vLLM #42982");
  sub->add_option("--roofline-copy-gbs", o.roofline.rates.copy_gbs,
                  "roofline: device copy bandwidth, GB/s (default: the H200's)")
      ->capture_default_str();
  sub->add_option("--roofline-fp8-tflops", o.roofline.rates.fp8_tflops,
                  "roofline: FP8 block-scaled GEMM rate, TFLOP/s")
      ->capture_default_str();
  sub->add_option("--roofline-bf16-tflops", o.roofline.rates.bf16_tflops,
                  "roofline: BF16 GEMM and attention rate, TFLOP/s")
      ->capture_default_str();
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "the server's latent cache, for the roofline's bytes: auto|bf16 (1152 B per "
                  "token and layer at V3.2's shapes) or fp8 (656 B)")
      ->capture_default_str();
  sub->callback([a, in, out, np, mc] {
    bench::ServeOptions& o = a->o;
    if (!a->preset.empty()) {
      const bench::Preset& p = bench::find_preset(a->preset);
      if (!in->count()) o.input_len = p.input_len;
      if (!out->count()) o.output_len = p.output_len;
      if (!mc->count()) o.max_concurrency = p.max_concurrency;
      if (!np->count()) o.num_prompts = p.num_prompts;
    }
    if (!a->host.empty() || a->port) {
      bench::BaseUrl b = bench::parse_base_url(o.base_url);
      if (!a->host.empty()) b.host = a->host;
      if (a->port) b.port = a->port;
      const bool v6 = b.host.find(':') != std::string::npos;
      o.base_url = str_cat("http://", v6 ? "[" : "", b.host, v6 ? "]" : "", ":", b.port, b.prefix);
    }
    const std::vector<double> rates = parse_rates(a->request_rate);
    o.request_rate = rates.front();
    o.percentiles = parse_percentiles(a->percentiles);
    const bench::RooflineOptions& ro = o.roofline;
    if (!(ro.rates.copy_gbs > 0 && ro.rates.fp8_tflops > 0 && ro.rates.bf16_tflops > 0))
      fail("--roofline-copy-gbs, --roofline-fp8-tflops and --roofline-bf16-tflops must be > 0");
    if (a->kv_cache_dtype == "fp8")
      o.roofline.fp8_latent_cache = true;
    else if (a->kv_cache_dtype != "auto" && a->kv_cache_dtype != "bf16")
      fail("--kv-cache-dtype must be auto, bf16 or fp8, got '", a->kv_cache_dtype, "'");
    if (o.api_key.empty())
      if (const char* k = std::getenv("OPENAI_API_KEY")) o.api_key = k;
    const std::vector<bench::ServeResult> runs = bench::run_serve_sweep(o, rates);
    for (const bench::ServeResult& r : runs)
      if (r.metrics.completed == 0) fail("every request failed");
  });
}

std::vector<int> parse_batches(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0 || v > 4096)
      fail("--batch takes batch sizes from 1 to 4096, comma-separated (e.g. 1,16,64), got '", s,
           "'");
    out.push_back(int(v));
    pos = comma + 1;
  }
  return out;
}

void add_step(CLI::App& bench) {
  auto a = std::make_shared<bench::StepOptions>();
  auto batches = std::make_shared<std::string>("1");
  CLI::App* sub = bench.add_subcommand(
      "step", "time prefill and decode steps of a model on the GPU against the card's ceilings");
  sub->add_option("--model", a->model_dir, "model folder (config.json + safetensors)");
  sub->add_option("--preset", a->preset,
                  "a named config with random weights made on the GPU (dsv32: DeepSeek-V3.2's full "
                  "width, 5 layers, FP8)");
  sub->add_option("--load-format", a->load_format, "auto | dummy (random weights on the GPU)")
      ->capture_default_str();
  sub->add_option("--batch", *batches, "decode batch sizes, comma-separated")
      ->capture_default_str();
  sub->add_option("--context", a->context, "context length of every decoding sequence")
      ->capture_default_str();
  sub->add_option("--spec-tokens", a->spec_tokens,
                  "also time a speculative verify step per batch size: 1 + this many tokens per "
                  "sequence (MTP's K, 0: none)")
      ->check(CLI::Range(0, 3));
  sub->add_option("--accepted-length", a->accepted_length,
                  "with --spec-tokens K: print the speedup of MTP decoding at this mean accepted "
                  "length (tokens a sequence per verify step, 1 .. 1 + K; e.g. the one `osprey "
                  "eval --speculative-config` reports)");
  sub->add_option("--prefill", a->prefill, "also time a prefill of this many tokens (0: none)")
      ->capture_default_str();
  sub->add_option("--warmup", a->warmup, "untimed decode steps first")->capture_default_str();
  sub->add_option("--iters", a->iters, "timed decode steps (median reported)")
      ->capture_default_str();
  sub->add_option("--prefill-iters", a->prefill_iters, "timed prefill steps")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "random weights, cache contents and tokens")
      ->capture_default_str();
  sub->add_flag("!--bf16", a->fp8, "dummy weights: BF16 linears instead of FP8");
  sub->add_flag(
      "--cuda-graph", a->cuda_graph,
      "also time each decode batch (and each verify batch, with --spec-tokens) as a CUDA graph "
      "replay (engine/cuda_graph_runner.h: the metadata copy + the replay + the logits "
      "read-back, as the eager row), with the graph's kernels per step");
  sub->add_flag("--engine-loop", a->engine_loop,
                "also decode --iters steps of --batch requests (prompts of --context tokens) "
                "through the engine with async scheduling on and off: host time per step, the "
                "device's idle gap, identical tokens (without CUDA: this part alone, --model DIR "
                "on the CPU)");
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "latent KV cache: auto (BF16) | bf16 | fp8 (DeepSeek's fp8_ds_mla format)")
      ->capture_default_str();
  sub->callback([a, batches] {
    if (a->load_format != "auto" && a->load_format != "dummy")
      fail("--load-format must be auto or dummy, got '", a->load_format, "'");
    if (a->context < 1) fail("--context must be at least 1");
    if (a->accepted_length != 0 &&
        (a->spec_tokens == 0 || a->accepted_length < 1 || a->accepted_length > 1 + a->spec_tokens))
      fail("--accepted-length must lie in 1 .. 1 + --spec-tokens (", 1 + a->spec_tokens,
           ") and needs --spec-tokens, got ", a->accepted_length);
    a->batches = parse_batches(*batches);
    bench::run_step_benchmark(*a);
  });
}

void add_kernels(CLI::App& bench) {
  auto a = std::make_shared<bench::KernelOptions>();
  CLI::App* sub = bench.add_subcommand(
      "kernels", "time each fast kernel alone on DeepSeek-V3.2's shapes against the ceilings");
  sub->add_option("--op", a->op, "which op's kernels: mla, gemm, moe or indexer")
      ->capture_default_str();
  sub->add_option("--warmup", a->warmup, "untimed calls first")->capture_default_str();
  sub->add_option("--iters", a->iters, "timed calls (median reported)")->capture_default_str();
  sub->add_option("--seed", a->seed, "random inputs")->capture_default_str();
  sub->add_flag("!--no-baseline", a->baseline, "skip timing the CUDA-core kernels");
  sub->add_flag("--quick", a->quick, "three shapes only");
  sub->add_option("--m", a->ms, "gemm and moe: token counts, comma-separated")->delimiter(',');
  sub->add_option("--mla-kernel", a->mla_kernel,
                  "mla: only the shapes of one kernel: 'sparse decode', 'dense decode' or "
                  "'sparse prefill'");
  sub->callback([a] {
    if (a->iters < 1 || a->warmup < 0) fail("--iters must be at least 1 and --warmup at least 0");
    bench::run_kernel_benchmark(*a);
  });
}

struct CommArgs {
  bench::CommBenchOptions o;
  dist::ParallelConfig parallel;
  std::string device = "cpu";
  std::string op = "all";
  std::vector<int64_t> tokens = {1, 64, 2048};
};

void add_comm(CLI::App& bench) {
  auto a = std::make_shared<CommArgs>();
  CLI::App* sub = bench.add_subcommand(
      "comm",
      "time all-reduce and all-to-all alone on the ranks at DeepSeek-V3.2's step sizes, with "
      "nccl-tests' algorithm and bus bandwidth (ranks launched as osprey serve's)");
  add_parallel_flags(sub, a->parallel);
  sub->add_option("--device", a->device,
                  "cpu (ranks as threads, or TCP processes with --nnodes) or cuda (one process "
                  "per GPU over NCCL: --nnodes W --node-rank r)")
      ->capture_default_str();
  sub->add_option("--op", a->op, "all, all_reduce or all_to_all")->capture_default_str();
  sub->add_option("--tokens", a->tokens,
                  "tokens per message, comma-separated (1: a decode step, 64: a decode batch, "
                  "2048: a prefill chunk)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--hidden", a->o.hidden, "hidden size (DeepSeek-V3.2: 7168)")
      ->capture_default_str();
  sub->add_option("--topk", a->o.topk, "routed experts per token (all-to-all rows per token)")
      ->capture_default_str();
  sub->add_option("--warmup", a->o.warmup, "untimed calls per size")->capture_default_str();
  sub->add_option("--iters", a->o.iters, "timed calls per size (median reported)")
      ->capture_default_str();
  sub->callback([a] {
    if (a->op != "all" && a->op != "all_reduce" && a->op != "all_to_all")
      fail("--op must be all, all_reduce or all_to_all, got '", a->op, "'");
    a->o.all_reduce = a->op != "all_to_all";
    a->o.all_to_all = a->op != "all_reduce";
    a->o.tokens = a->tokens;
    bench::run_comm_benchmark(a->parallel, parse_device_flag(a->device), a->o);
  });
}

void register_cmd(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "benchmarks: serve (an OpenAI-compatible server), step (model steps on the GPU), kernels "
      "(fast kernels alone on the GPU), comm (collectives on the ranks)");
  bench->require_subcommand(1);
  add_serve(*bench);
  add_step(*bench);
  add_kernels(*bench);
  add_comm(*bench);
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
