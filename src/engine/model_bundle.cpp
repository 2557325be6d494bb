#include "engine/model_bundle.h"

#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#endif
#include "model/greedy.h"
#include "model/make_model.h"

namespace osprey {

namespace fs = std::filesystem;

ModelBundle load_model_bundle(const std::string& dir, const ModelBundleOptions& o) {
  ModelBundle b;
  b.dir = dir;
  if (!fs::exists(fs::path(dir) / "config.json"))
    fail("no config.json in '", dir, "': give --model a Hugging Face model folder");
#ifdef OSPREY_WITH_CUDA
  if (o.device == Device::CUDA) cuda::require_device();  // the dummy and parallel paths too
#endif
  if (o.parallel.parallel()) {
    RankGroupOptions ro;
    ro.device = o.device;
    ro.dummy_weights = o.dummy_weights;
    ro.dummy_seed = o.dummy_seed;
    if (o.dummy_weights && o.device == Device::CPU)
      fail(
          "--load-format dummy with a parallel "
          "model needs --device cuda");
    b.group = std::make_unique<RankGroup>(dir, o.parallel, ro);
    if (!b.group->has_leader()) return b;  // a node without rank 0: serve_until_stopped()
    b.model = b.group->take_leader();
  } else if (o.dummy_weights && o.device == Device::CUDA) {
    // Random weights made on the GPU (no files written).
    ModelConfig c = ModelConfig::from_file(dir);
    ModelWeights w = make_dummy_weights_cuda(c, o.dummy_seed, /*fp8=*/c.quant.fp8);
    b.model = std::make_unique<DeepseekModel>(std::move(c), std::move(w));
  } else if (o.dummy_weights) {
    // Random weights for the config: written to a scratch folder, loaded, removed.
    const ModelConfig c = ModelConfig::from_file(dir);
    const fs::path tmp = fs::temp_directory_path() / ("osprey-dummy-" + std::to_string(::getpid()) +
                                                      "-" + std::to_string(o.dummy_seed));
    MakeModelOptions mo;
    mo.seed = o.dummy_seed;
    make_model(c, tmp.string(), mo);
    b.model = load_model_cpu(tmp.string());
    fs::remove_all(tmp);
  } else {
    b.model = load_model(dir, o.device);
  }
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    b.tokenizer = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(dir));
    if (b.tokenizer->id_limit() > b.model->config().vocab_size)
      fail(dir, ": the tokenizer has ", b.tokenizer->id_limit(), " ids but the model only ",
           b.model->config().vocab_size, " rows");
    tokenizer::ChatFormat fmt;
    if (o.chat_format == "auto") {
      fmt = tokenizer::detect_chat_format(dir, *b.tokenizer);
    } else {
      const auto f = tokenizer::parse_chat_format(o.chat_format);
      if (!f)
        fail("unknown chat format '", o.chat_format,
             "' (auto, deepseek-v3, deepseek-v3.1, simple)");
      fmt = *f;
    }
    b.chat = std::make_unique<tokenizer::ChatEncoder>(*b.tokenizer, fmt);
  }
  return b;
}

std::vector<int32_t> ModelBundle::encode_chat(const std::vector<tokenizer::ChatMessage>& messages,
                                              const tokenizer::ChatOptions& options) const {
  if (!chat) fail("model '", dir, "' has no tokenizer.json: send token ids instead of text");
  const auto ids = chat->encode(messages, options);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int32_t> ModelBundle::encode_text(const std::string& text) const {
  if (!tokenizer) fail("model '", dir, "' has no tokenizer.json: send token ids instead of text");
  tokenizer::EncodeOptions eo;
  eo.add_special_tokens = true;
  const auto ids = tokenizer->encode(text, eo);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

}  // namespace osprey
