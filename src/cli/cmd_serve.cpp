// osprey serve: the OpenAI-compatible HTTP server (see server/openai_server.h).
#include <cstdio>

#ifdef OSPREY_WITH_CUDA
#include "ops/ceilings.h"
#endif
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli/command.h"
#include "cli/model_paths.h"
#include "core/error.h"
#include "engine/memory_profile.h"
#include "engine/tokenizer_decoder.h"
#include "kv/kv_cache_dtype.h"
#include "server/openai_server.h"

namespace osprey::cli {
namespace {

struct Args {
  std::string model, host = "127.0.0.1", served_model_name, api_key, device = "cpu",
                     load_format = "auto", chat_format = "auto", kv_cache_dtype = "auto";
  int port = 8000, max_model_len = 0, max_num_seqs = 64, max_num_batched_tokens = 2048,
      io_threads = 2;
  double kv_cache_memory_gb = 0.25, gpu_memory_utilization = 0.9;
  size_t max_request_bytes = size_t(16) << 20, max_queued = 4096;
  bool no_prefix_caching = false;
  uint64_t seed = 0;
};

server::HttpServer* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

void run(const Args& a, bool kv_given, bool util_given) {
  if (a.device != "cpu" && a.device != "cuda")
    fail("--device must be cpu or cuda, got '", a.device, "'");
  const bool cuda = a.device == "cuda";
  if (util_given && !cuda)
    fail(
        "--gpu-memory-utilization applies to --device cuda; on the CPU give --kv-cache-memory "
        "(GiB)");
  if (!(a.gpu_memory_utilization > 0 && a.gpu_memory_utilization < 1))
    fail("--gpu-memory-utilization must be in (0, 1), got ", a.gpu_memory_utilization);
  if (a.load_format != "auto" && a.load_format != "dummy" && a.load_format != "safetensors")
    fail("--load-format must be auto, safetensors or dummy, got '", a.load_format, "'");
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(a.kv_cache_dtype);
  const std::string dir = resolve_model_dir(a.model);
  ModelBundleOptions bo;
  bo.chat_format = a.chat_format;
  bo.dummy_weights = a.load_format == "dummy";
  bo.dummy_seed = a.seed;
  bo.device = cuda ? Device::CUDA : Device::CPU;
  ModelBundle bundle = load_model_bundle(dir, bo);
  bundle.model->set_kv_cache_dtype(kv_dtype);
  EngineConfig ec;
  ec.max_num_seqs = a.max_num_seqs;
  ec.max_num_batched_tokens = a.max_num_batched_tokens;
  ec.max_model_len = a.max_model_len;
  ec.kv_cache_bytes = int64_t(a.kv_cache_memory_gb * double(1ll << 30));
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
    const StepProfile prof =
        profile_step_memory(*bundle.model, a.max_num_batched_tokens, model_len, a.max_num_seqs);
    ops::cuda::memory_info(&free_b, &total_b);
    ec.kv_cache_bytes = int64_t(a.gpu_memory_utilization * double(free_b));
    std::fprintf(stderr,
                 "osprey: profile step (%lld tokens at context %lld, %.2f s) took %.2f GiB; KV "
                 "cache %.2f GiB (%.2f of %.2f GiB free after the weights and the step)\n",
                 (long long)prof.tokens, (long long)prof.context, prof.seconds,
                 double(free_weights - free_b) / double(1ll << 30),
                 double(ec.kv_cache_bytes) / double(1ll << 30), a.gpu_memory_utilization,
                 double(free_b) / double(1ll << 30));
  }
#endif
  ec.enable_prefix_caching = !a.no_prefix_caching;
  ec.seed = a.seed;
  server::Metrics metrics;
  TextDecoderFactory decoders;
  if (bundle.tokenizer) decoders = make_text_decoder_factory(*bundle.tokenizer);
  AsyncEngine engine(*bundle.model, ec, decoders, [&metrics](const EngineStats& s) {
    metrics.observe_step(s.last_step_seconds);
  });
  server::ServerOptions so;
  so.served_model_name = a.served_model_name.empty() ? dir : a.served_model_name;
  so.api_key = a.api_key;
  if (so.api_key.empty())
    if (const char* k = std::getenv("OSPREY_API_KEY")) so.api_key = k;
  so.max_queued = a.max_queued;
  so.max_num_seqs = a.max_num_seqs;
  server::OpenAIServer api(bundle, engine, metrics, so);
  server::HttpServerOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.io_threads = a.io_threads;
  ho.max_body_bytes = a.max_request_bytes;
  server::HttpServer http(
      ho, [&api](const server::HttpRequest& r, std::shared_ptr<server::Responder> res) {
        api.handle(r, std::move(res));
      });
  g_server = &http;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const EngineStats st = engine.stats();
  std::fprintf(
      stderr,
      "osprey serve: %s as '%s' on http://%s:%d (%s, max_model_len %d, %lld KV blocks of %d "
      "tokens, latent cache %s, max_num_seqs %d, %s)\n",
      dir.c_str(), so.served_model_name.c_str(), a.host.c_str(), http.port(), a.device.c_str(),
      engine.max_model_len(), (long long)st.kv_blocks_total, kBlockSize,
      bundle.model->fp8_latent_cache() ? "fp8"
      : cuda                           ? "bf16"
                                       : "f32",
      a.max_num_seqs,
      bundle.tokenizer ? tokenizer::chat_format_name(bundle.chat->format()).data()
                       : "no tokenizer");
  std::fflush(stderr);
  http.run();
  g_server = nullptr;
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
                  "tokens per step (default 2048)");
  auto* kv = sub->add_option("--kv-cache-memory", a->kv_cache_memory_gb,
                             "KV cache size in GiB (default 0.25)");
  auto* util = sub->add_option(
      "--gpu-memory-utilization", a->gpu_memory_utilization,
      "fraction of the GPU memory left after the weights for the KV cache (cuda; default 0.9)");
  sub->add_option("--api-key", a->api_key, "required Bearer key for /v1 (also $OSPREY_API_KEY)");
  sub->add_option("--device", a->device, "cpu | cuda");
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "latent KV cache: auto (default: F32 on cpu, BF16 on cuda) | bf16 (cuda) | fp8 "
                  "(DeepSeek's fp8_ds_mla: e4m3 + a scale per 128, rope bf16: 656 B per token and "
                  "layer at V3.2 shapes, BF16 1152)");
  sub->add_option("--load-format", a->load_format,
                  "auto | safetensors | dummy (random weights, config.json only)");
  sub->add_option("--chat-format", a->chat_format, "auto | deepseek-v3 | deepseek-v3.1 | simple");
  sub->add_option("--max-request-bytes", a->max_request_bytes,
                  "largest request body (default 16 MiB)");
  sub->add_option("--max-queued-requests", a->max_queued,
                  "requests waiting beyond the batch before 503");
  sub->add_option("--io-threads", a->io_threads, "HTTP I/O threads (default 2)");
  sub->add_flag("--no-enable-prefix-caching", a->no_prefix_caching, "turn prefix caching off");
  sub->add_option("--seed", a->seed, "seed for requests without one, and for dummy weights");
  sub->callback([a, kv, util] { run(*a, kv->count() > 0, util->count() > 0); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
