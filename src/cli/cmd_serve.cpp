// osprey serve: the OpenAI-compatible HTTP server (see server/openai_server.h).
//   Start-up errors name the numbers: a missing CUDA backend or device, weights larger than the
//   free GPU memory, a KV cache that cannot hold one max_model_len sequence (engine.cpp).
//   SIGTERM / SIGINT: stop accepting, let the requests in flight finish for --shutdown-timeout
//   seconds, end the rest (a stream with a final error event), exit 0. A second signal skips the
//   wait.
//   Logs: a stats line every --log-stats-interval seconds while busy (as vLLM's), and with
//   --enable-log-requests one access line per request.
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#include "model/weights.h"
#include "ops/ceilings.h"
#endif

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/model_paths.h"
#include "cli/parallel_flags.h"
#include "core/error.h"
#include "engine/memory_profile.h"
#include "engine/tokenizer_decoder.h"
#include "kv/kv_cache_dtype.h"
#include "server/openai_server.h"
#include "server/parser_choice.h"

namespace osprey::cli {
namespace {

struct Args {
  dist::ParallelConfig parallel;
  std::string model, host = "127.0.0.1", served_model_name, api_key, device = "cpu",
                     load_format = "auto", chat_format = "auto", kv_cache_dtype = "auto",
                     tool_call_parser = "auto", reasoning_parser = "auto", speculative_config,
                     token_budget_policy = "fixed";
  double target_step_ms = 0;
  int port = 8000, max_model_len = 0, max_num_seqs = 64, max_num_batched_tokens = 0, io_threads = 2;
  int64_t num_blocks_override = 0;
  double kv_cache_memory_gb = 0.25, gpu_memory_utilization = 0.9;
  size_t max_request_bytes = size_t(16) << 20, max_queued = 4096;
  bool no_prefix_caching = false, enable_log_requests = false, disable_log_stats = false;
  bool enable_auto_tool_choice = false;
  bool async_scheduling = true;
  CudaGraphFlags graphs;
  uint64_t seed = 0;
  double shutdown_timeout_s = 10, log_stats_interval_s = 10;
};

// After the drain, how long the last responses (error events, 503s) get to reach the clients.
constexpr auto kFlushGrace = std::chrono::seconds(2);

// The name clients use by default: the model folder's own name ("osprey-arith"), as a served
// model is named by its repository, not by where it sits on this disk.
std::string default_served_name(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (p.has_filename()) return p.filename().string();
  return p.parent_path().filename().string();  // "models/osprey-arith/"
}

// Before loading anything onto the GPU: a CUDA device is there, and the weights fit its free
// memory (a lower bound of their bytes: every weight at its stored width, scales and the step
// workspace not counted).
void check_cuda_fits(const std::string& dir, bool dummy) {
#ifndef OSPREY_WITH_CUDA
  (void)dir;
  (void)dummy;
  fail(
      "--device cuda: this osprey was built without the CUDA backend (see `osprey --version`); "
      "rebuild where nvcc is installed, or serve with --device cpu");
#else
  cuda::require_device();
  const ModelConfig c = ModelConfig::from_file(dir);
  double need = 0;
  for (const WeightSpec& w : weight_specs(c))
    need += double(shape_numel(w.shape)) * (w.fp8 && c.quant.fp8 ? 1.0 : 2.0);
  if (!dummy) {
    double files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") files += double(e.file_size());
    need = std::max(need, files);
  }
  size_t free_b = 0, total_b = 0;
  ops::cuda::memory_info(&free_b, &total_b);
  constexpr double kGiB = double(int64_t(1) << 30);
  if (need > double(free_b))
    fail("the model's weights need at least ", need / kGiB, " GiB but the GPU has ",
         double(free_b) / kGiB, " GiB free of ", double(total_b) / kGiB,
         " GiB: use a GPU with more memory, a quantized (fp8) checkpoint, or --device cpu");
#endif
}

// Every interval while the engine is busy or was since the last line, one line as vLLM's:
// throughput over the interval, running and waiting requests, KV cache use, prefix hit rate.
class StatsLogger {
 public:
  StatsLogger(const AsyncEngine& engine, double interval_s) : engine_(engine) {
    if (interval_s <= 0) return;
    thread_ = std::thread([this, interval_s] { loop(interval_s); });
  }
  ~StatsLogger() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop(double interval_s) {
    using Clock = std::chrono::steady_clock;
    EngineStats last = engine_.stats();
    Clock::time_point t_last = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s), [&] { return stop_; })) {
      const EngineStats s = engine_.stats();
      const Clock::time_point now = Clock::now();
      const double dt = std::chrono::duration<double>(now - t_last).count();
      const int64_t prompt = s.prompt_tokens_total - last.prompt_tokens_total;
      const int64_t gen = s.generation_tokens_total - last.generation_tokens_total;
      const int64_t queries = s.prefix_query_tokens - last.prefix_query_tokens;
      const int64_t hits = s.prefix_hit_tokens - last.prefix_hit_tokens;
      if (s.num_running + s.num_waiting > 0 || prompt > 0 || gen > 0) {
        std::fprintf(
            stderr,
            "osprey serve: prompt throughput %.1f tokens/s, generation throughput %.1f "
            "tokens/s, running %d reqs, waiting %d reqs, KV cache usage %.1f%%, prefix "
            "cache hit rate %.1f%%, preemptions %lld\n",
            double(prompt) / dt, double(gen) / dt, s.num_running, s.num_waiting,
            s.kv_blocks_total ? 100.0 * double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0.0,
            queries ? 100.0 * double(hits) / double(queries) : 0.0, (long long)s.num_preemptions);
        std::fflush(stderr);
      }
      last = s;
      t_last = now;
    }
  }

  const AsyncEngine& engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Waits (on its own thread) for SIGTERM or SIGINT, then shuts the server down in order: no new
// connections or generation requests; the requests in flight get up to `timeout_s` to finish
// (a second signal ends the wait); the rest are aborted with an error their clients see; the
// connections get kFlushGrace to send it; the HTTP server stops, so `http.run()` returns.
class GracefulShutdown {
 public:
  GracefulShutdown(server::HttpServer& http, server::OpenAIServer& api, double timeout_s)
      : signals_(io_, SIGINT, SIGTERM) {
    signals_.async_wait([this](const boost::system::error_code& ec, int signo) {
      if (!ec) signo_ = signo;
    });
    thread_ = std::thread([this, &http, &api, timeout_s] {
      io_.run();  // until the first signal (or stop() when the server ends without one)
      if (signo_ == 0) return;
      using Clock = std::chrono::steady_clock;
      const auto t0 = Clock::now();
      http.stop_accepting();
      api.begin_shutdown();
      const size_t in_flight_at_signal = api.in_flight();
      std::fprintf(stderr,
                   "osprey serve: %s: no new requests; %zu in flight get up to %.1f s to finish "
                   "(--shutdown-timeout)\n",
                   signo_ == SIGINT ? "SIGINT" : "SIGTERM", in_flight_at_signal, timeout_s);
      std::fflush(stderr);
      bool forced = false;
      signals_.async_wait([&forced](const boost::system::error_code& ec, int) {
        if (!ec) forced = true;
      });
      io_.restart();
      const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_s));
      while (!forced && Clock::now() < deadline &&
             api.wait_idle(std::min(deadline, Clock::now() + std::chrono::milliseconds(100))) > 0)
        io_.poll();
      const size_t left = api.in_flight();
      const size_t finished = in_flight_at_signal > left ? in_flight_at_signal - left : 0;
      if (left > 0) {
        std::fprintf(stderr, "osprey serve: aborting %zu requests still in flight%s\n", left,
                     forced ? " (second signal)" : " (shutdown timeout)");
        api.abort_in_flight();
        api.wait_idle(Clock::now() + kFlushGrace);
      }
      const size_t open = http.close_connections(kFlushGrace);
      std::fprintf(stderr,
                   "osprey serve: shut down in %.2f s (%zu finished in time, %zu aborted, %zu "
                   "connections cut)\n",
                   std::chrono::duration<double>(Clock::now() - t0).count(), finished, left, open);
      std::fflush(stderr);
      http.stop();
    });
  }
  ~GracefulShutdown() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  int signo_ = 0;
  std::thread thread_;
};

void run(const Args& a, bool kv_given, bool util_given) {
  (void)kv_given;  // read by the CUDA build only
  const bool cuda = parse_device_flag(a.device) == Device::CUDA;
  if (util_given && !cuda)
    fail(
        "--gpu-memory-utilization applies to --device cuda; on the CPU give --kv-cache-memory "
        "(GiB)");
  if (!(a.gpu_memory_utilization > 0 && a.gpu_memory_utilization < 1))
    fail("--gpu-memory-utilization must be in (0, 1), got ", a.gpu_memory_utilization);
  if (a.load_format != "auto" && a.load_format != "dummy" && a.load_format != "safetensors")
    fail("--load-format must be auto, safetensors or dummy, got '", a.load_format, "'");
  if (!(a.shutdown_timeout_s >= 0))
    fail("--shutdown-timeout must be a number of seconds >= 0, got ", a.shutdown_timeout_s);
  if (!(a.kv_cache_memory_gb > 0))
    fail("--kv-cache-memory must be a positive number of GiB, got ", a.kv_cache_memory_gb);
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(a.kv_cache_dtype);
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.speculative_config);  // fails early
  const TokenBudgetPolicy budget_policy = parse_token_budget_policy(a.token_budget_policy);
  if (!(a.target_step_ms >= 0))
    fail("--target-step-ms must be a number of milliseconds >= 0 (0: automatic), got ",
         a.target_step_ms);
  const std::string dir = resolve_model_dir(a.model);
  if (cuda) check_cuda_fits(dir, a.load_format == "dummy");
  ModelBundleOptions bo;
  bo.chat_format = a.chat_format;
  bo.dummy_weights = a.load_format == "dummy";
  bo.dummy_seed = a.seed;
  bo.device = cuda ? Device::CUDA : Device::CPU;
  bo.parallel = a.parallel;
  ModelBundle bundle = load_model_bundle(dir, bo);
  if (serve_worker_ranks(bundle.group.get())) return;
  bundle.model->set_kv_cache_dtype(kv_dtype);
  int budget = a.max_num_batched_tokens;
  if (budget == 0) {  // vLLM's default for the device (engine.h)
    size_t total_b = 0;
    std::string name;
#ifdef OSPREY_WITH_CUDA
    if (cuda) {
      size_t free_b = 0;
      ops::cuda::memory_info(&free_b, &total_b);
      name = ops::cuda::device_name();
    }
#endif
    budget = server_default_max_num_batched_tokens(cuda, total_b, name);
  }
  EngineConfig ec;
  ec.max_num_seqs = a.max_num_seqs;
  ec.max_num_batched_tokens = budget;
  ec.token_budget_policy = budget_policy;
  ec.target_step_ms = a.target_step_ms;
  ec.max_model_len = a.max_model_len;
  ec.kv_cache_bytes = int64_t(a.kv_cache_memory_gb * double(1ll << 30));
  if (a.num_blocks_override < 0)
    fail("--num-gpu-blocks-override must be a positive number of blocks, got ",
         a.num_blocks_override);
  ec.num_blocks = a.num_blocks_override;
  const int model_len =
      a.max_model_len > 0 ? a.max_model_len : int(bundle.model->config().max_position_embeddings);
  // The expanded attention path's memory grows with a step's Σ seq_lens: bound it by one
  // sequence of max_model_len (what the profile step below measures); wider steps run absorbed.
  bundle.model->set_max_expanded_kv_rows(model_len);
#ifndef OSPREY_WITH_CUDA
  (void)kv_given;  // the GPU memory profile below decides the cache size only with CUDA
#else
  if (cuda && !kv_given) {
    // The KV cache takes this fraction of the memory left after the weights and after a profile
    // step at the largest batch has grown the step workspace and the ops' scratch to their peak.
    size_t free_b = 0, total_b = 0;
    ops::cuda::memory_info(&free_b, &total_b);
    const size_t free_weights = free_b;
    const StepProfile prof = profile_step_memory(*bundle.model, budget, model_len, a.max_num_seqs);
    ops::cuda::memory_info(&free_b, &total_b);
    ec.kv_cache_bytes = int64_t(a.gpu_memory_utilization * double(free_b));
    std::fprintf(stderr,
                 "osprey: profile step (%lld tokens in %lld sequence%s at context %lld, %.2f s) "
                 "took %.2f GiB; KV cache %.2f GiB (%.2f of %.2f GiB free after the weights and "
                 "the step)\n",
                 (long long)prof.tokens, (long long)prof.sequences, prof.sequences == 1 ? "" : "s",
                 (long long)prof.context, prof.seconds,
                 double(free_weights - free_b) / double(1ll << 30),
                 double(ec.kv_cache_bytes) / double(1ll << 30), a.gpu_memory_utilization,
                 double(free_b) / double(1ll << 30));
  }
#endif
  ec.enable_prefix_caching = !a.no_prefix_caching;
  ec.seed = a.seed;
  ec.speculative = spec;
  ec.async_scheduling = a.async_scheduling;
  ec.cuda_graph = use_cuda_graph(a.graphs, bundle.model->device(), bundle.model->parallel());
  ec.cuda_graph_capture_sizes = a.graphs.sizes;
  server::Metrics metrics;
  TextDecoderFactory decoders;
  if (bundle.tokenizer) decoders = make_text_decoder_factory(*bundle.tokenizer);
  AsyncEngine engine(*bundle.model, ec, decoders,
                     [&metrics](const EngineStats& s) { metrics.observe_step(s.last_step); });
  server::ServerOptions so;
  so.served_model_name =
      a.served_model_name.empty() ? default_served_name(dir) : a.served_model_name;
  so.api_key = a.api_key;
  if (so.api_key.empty())
    if (const char* k = std::getenv("OSPREY_API_KEY")) so.api_key = k;
  so.max_queued = a.max_queued;
  so.max_num_seqs = a.max_num_seqs;
  if (bundle.chat) {
    so.tool_call_parser =
        server::choose_tool_call_format(a.tool_call_parser, bundle.chat->format());
    so.reasoning_parser = server::choose_reasoning_format(a.reasoning_parser, bundle.chat->format(),
                                                          server::read_chat_template(dir));
  }
  server::OpenAIServer api(bundle, engine, metrics, so);
  server::HttpServerOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.io_threads = a.io_threads;
  ho.max_body_bytes = a.max_request_bytes;
  ho.log_requests = a.enable_log_requests;
  server::HttpServer http(
      ho, [&api](const server::HttpRequest& r, std::shared_ptr<server::Responder> res) {
        api.handle(r, std::move(res));
      });
  GracefulShutdown shutdown(http, api, a.shutdown_timeout_s);
  StatsLogger stats(engine, a.disable_log_stats ? 0.0 : a.log_stats_interval_s);
  const EngineStats st = engine.stats();
  std::fprintf(
      stderr,
      "osprey serve: %s as '%s' on http://%s:%d (%s, max_model_len %d, %lld KV blocks of %d "
      "tokens, latent cache %s, max_num_seqs %d, token budget %s, %s, tool calls %s, reasoning "
      "%s)\n",
      dir.c_str(), so.served_model_name.c_str(), a.host.c_str(), http.port(), a.device.c_str(),
      engine.max_model_len(), (long long)st.kv_blocks_total, kBlockSize,
      bundle.model->fp8_latent_cache() ? "fp8"
      : cuda                           ? "bf16"
                                       : "f32",
      a.max_num_seqs,
      budget_policy == TokenBudgetPolicy::Fixed
          ? str_cat("fixed ", budget).c_str()
          : str_cat("step-time ", budget, " (target ",
                    a.target_step_ms > 0 ? str_cat(a.target_step_ms, " ms").c_str() : "auto", ")")
                .c_str(),
      bundle.tokenizer ? tokenizer::chat_format_name(bundle.chat->format()).data() : "no tokenizer",
      so.tool_call_parser ? server::tool_call_format_name(*so.tool_call_parser).data() : "off",
      so.reasoning_parser ? server::reasoning_format_name(*so.reasoning_parser).data() : "off");
  std::fflush(stderr);
  http.run();
}

void register_cmd(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  sub->add_option("--model", a->model,
                  "model folder (default: $OSPREY_MODEL or the bundled model)");
  sub->add_option("--host", a->host, "address to listen on (default 127.0.0.1)");
  sub->add_option("--port", a->port, "port (default 8000; 0 picks a free one)");
  sub->add_option("--served-model-name", a->served_model_name,
                  "the name clients use (default: the folder)");
  sub->add_option("--max-model-len", a->max_model_len,
                  "longest prompt + completion (default: the model's)");
  sub->add_option("--max-num-seqs", a->max_num_seqs, "sequences per step (default 64)");
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens,
                  "tokens per step (default, vLLM's for its server: 8192 on a GPU of at least "
                  "70 GiB other than an A100, else 2048)");
  sub->add_option("--token-budget-policy", a->token_budget_policy,
                  "prompt tokens per step: fixed (whatever --max-num-batched-tokens leaves after "
                  "the decodes) | step-time (chunks beside decodes cut so the step's predicted "
                  "time stays within --target-step-ms)")
      ->capture_default_str();
  sub->add_option("--target-step-ms", a->target_step_ms,
                  "step-time policy: the predicted time of a step with decodes and prompt chunks "
                  "(default 0: twice a decode-only step of --max-num-seqs sequences)");
  auto* kv = sub->add_option("--kv-cache-memory", a->kv_cache_memory_gb,
                             "KV cache size in GiB (default 0.25)");
  auto* util = sub->add_option(
      "--gpu-memory-utilization", a->gpu_memory_utilization,
      "fraction of the GPU memory left after the weights for the KV cache (cuda; default 0.9)");
  sub->add_option("--num-gpu-blocks-override", a->num_blocks_override,
                  "KV cache blocks (of 64 tokens), overriding --kv-cache-memory and the GPU "
                  "profile (as vLLM's; also on cpu; for tests that force preemption)");
  sub->add_option("--api-key", a->api_key, "required Bearer key for /v1 (also $OSPREY_API_KEY)");
  sub->add_option("--device", a->device, "cpu | cuda");
  add_parallel_flags(sub, a->parallel);
  sub->add_option("--speculative-config", a->speculative_config,
                  "speculative decoding as JSON, e.g. '{\"method\": \"mtp\", "
                  "\"num_speculative_tokens\": 2}': the model's MTP layer drafts 1 to 3 tokens "
                  "per step, verified in one step (greedy output unchanged; sampling keeps the "
                  "target distribution)");
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "latent KV cache: auto (default: F32 on cpu, BF16 on cuda) | bf16 (cuda) | fp8 "
                  "(DeepSeek's fp8_ds_mla: e4m3 + a scale per 128, rope bf16: 656 B per token and "
                  "layer at V3.2 shapes, BF16 1152)");
  sub->add_option("--load-format", a->load_format,
                  "auto | safetensors | dummy (random weights, config.json only)");
  sub->add_option("--chat-format", a->chat_format,
                  "auto | deepseek-v3 | deepseek-v3.1 | deepseek-v3.2 | simple");
  sub->add_option("--tool-call-parser", a->tool_call_parser,
                  "auto (from the chat format) | none | deepseek_v3 | deepseek_v31 | deepseek_v32");
  sub->add_option("--reasoning-parser", a->reasoning_parser,
                  "auto (from the chat format and template) | none | deepseek_r1 | deepseek_v3");
  sub->add_flag("--enable-auto-tool-choice", a->enable_auto_tool_choice,
                "accepted for vLLM compatibility: tool_choice auto is on whenever a tool-call "
                "parser is");
  sub->add_option("--max-request-bytes", a->max_request_bytes,
                  "largest request body (default 16 MiB)");
  sub->add_option("--max-queued-requests", a->max_queued,
                  "requests waiting beyond the batch before 503");
  sub->add_option("--io-threads", a->io_threads, "HTTP I/O threads (default 2)");
  sub->add_flag("--no-enable-prefix-caching", a->no_prefix_caching, "turn prefix caching off");
  sub->add_flag("--async-scheduling,!--no-async-scheduling", a->async_scheduling,
                "schedule and build step N+1 while step N runs (default on; the same outputs "
                "as the synchronous loop; synchronous anyway with --speculative-config or a "
                "parallel model)");
  add_cuda_graph_flags(sub, a->graphs);
  sub->add_option("--seed", a->seed, "seed for requests without one, and for dummy weights");
  sub->add_option("--shutdown-timeout", a->shutdown_timeout_s,
                  "on SIGTERM/SIGINT, seconds the requests in flight get to finish before they "
                  "are aborted (default 10)");
  sub->add_flag("--enable-log-requests", a->enable_log_requests,
                "log one access line per request (peer, route, status, seconds, id, tokens)");
  sub->add_flag("--disable-log-stats", a->disable_log_stats,
                "no periodic stats line (throughput, running/waiting, KV use, prefix hits)");
  sub->add_option("--log-stats-interval", a->log_stats_interval_s,
                  "seconds between stats lines while busy (default 10)");
  sub->callback([a, kv, util] { run(*a, kv->count() > 0, util->count() > 0); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
