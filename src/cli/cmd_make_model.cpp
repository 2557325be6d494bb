// osprey make-model: a model folder with random weights (see model/make_model.h).
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "model/make_model.h"
#include "model/model_writer.h"

namespace osprey::cli {
namespace {

struct Args {
  std::string preset, config, out, dtype = "bf16";
  uint64_t seed = 0;
  bool fp8 = false, ue8m0 = false, config_only = false, mtp = false;
  int layers = 0;
  double shard_gb = 4.0;
};

void run(const Args& a) {
  if (a.preset.empty() == a.config.empty())
    fail("make-model needs exactly one of --preset or --config");
  ModelConfig c = a.preset.empty() ? ModelConfig::from_file(a.config) : preset_config(a.preset);
  if (a.layers > 0) c.num_hidden_layers = a.layers;
  if (a.mtp) c.num_nextn_predict_layers = 1;
  MakeModelOptions o;
  o.seed = a.seed;
  o.fp8 = a.fp8 || a.ue8m0;
  o.ue8m0 = a.ue8m0;
  if (a.dtype == "bf16")
    o.dtype = DType::BF16;
  else if (a.dtype == "f32")
    o.dtype = DType::F32;
  else
    fail("--dtype must be bf16 or f32, got '", a.dtype, "'");
  o.max_shard_bytes = int64_t(a.shard_gb * double(1ll << 30));
  if (o.max_shard_bytes <= 0) fail("--shard-gb must be positive");
  if (a.config_only) {
    ModelWriteOptions wo;
    wo.fp8 = o.fp8;
    wo.ue8m0 = o.ue8m0;
    write_model_config(c, a.out, wo);
    std::printf("wrote %s/config.json only (%s, %d layers%s): for --load-format dummy\n",
                a.out.c_str(), c.model_type_name.c_str(), c.num_hidden_layers,
                o.fp8 ? ", fp8" : "");
    return;
  }
  make_model(c, a.out, o);
  std::printf("wrote %s (%s, %d layers%s%s)\n", a.out.c_str(), c.model_type_name.c_str(),
              c.num_hidden_layers, c.num_nextn_predict_layers > 0 ? " + MTP layer" : "",
              o.fp8 ? (o.ue8m0 ? ", fp8 ue8m0" : ", fp8") : "");
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("make-model", "write a model folder with random weights");
  sub->add_option("--preset", args->preset, "v2-tiny | v3-tiny | v32-tiny | dsv32");
  sub->add_option("--config", args->config, "start from this config.json instead of a preset");
  sub->add_option("--out", args->out, "output folder")->required();
  sub->add_option("--seed", args->seed, "random seed (same seed, same weights)");
  sub->add_option("--dtype", args->dtype, "bf16 | f32 for unquantized tensors");
  sub->add_flag("--fp8", args->fp8,
                "quantize linear weights to FP8 e4m3 with 128x128 block scales");
  sub->add_flag("--ue8m0", args->ue8m0, "FP8 with power-of-two (ue8m0) scales");
  sub->add_option("--layers", args->layers, "override num_hidden_layers");
  sub->add_flag("--mtp", args->mtp,
                "add DeepSeek's MTP layer (num_nextn_predict_layers 1: model.layers.{layers}.*, "
                "for --speculative-config mtp)");
  sub->add_option("--shard-gb", args->shard_gb, "largest shard size in GiB");
  sub->add_flag("--config-only", args->config_only,
                "write config.json alone (serve/bench it with --load-format dummy)");
  sub->callback([args] { run(*args); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
