// osprey quantize: a bf16/f32 model folder → FP8 e4m3 with 128×128 block scales (model/quantize.h).
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "model/quantize.h"

namespace osprey::cli {
namespace {

struct Args {
  std::string model, out;
  bool ue8m0 = false;
  double shard_gb = 4.0;
};

void run(const Args& a) {
  const int64_t shard = int64_t(a.shard_gb * double(1ll << 30));
  if (shard <= 0) fail("--shard-gb must be positive");
  const QuantizeStats st = quantize_model_fp8(a.model, a.out, a.ue8m0, shard);
  std::printf(
      "wrote %s: %lld linear weights FP8 e4m3 (128x128 block scales%s), %lld tensors kept; "
      "read back: max |W - dequant| %.3g, %.3g of the tensor's max |W|\n",
      a.out.c_str(), static_cast<long long>(st.quantized_tensors), a.ue8m0 ? ", ue8m0" : "",
      static_cast<long long>(st.kept_tensors), st.max_abs_error, st.max_rel_error);
}

void register_cmd(CLI::App& app) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "quantize", "FP8 block-quantize a bf16/f32 model folder (DeepSeek's published format)");
  sub->add_option("--model", args->model, "source model folder (bf16 or f32)")->required();
  sub->add_option("--out", args->out, "output folder")->required();
  sub->add_flag("--ue8m0", args->ue8m0, "power-of-two (ue8m0) scales, as V3.1/V3.2");
  sub->add_option("--shard-gb", args->shard_gb, "largest shard size in GiB");
  sub->callback([args] { run(*args); });
}

}  // namespace
OSPREY_REGISTER_COMMAND(register_cmd);
}  // namespace osprey::cli
