// Reading tokenizer.json and tokenizer_config.json into a Tokenizer.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string read_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fail("cannot open ", what, " '", path.string(),
         "': pass a tokenizer.json file or a folder that contains one");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parse_json(std::string_view text, const char* what) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail(what, " is not valid JSON (", e.what(), ")");
  }
}

// The decoder must turn byte-level tokens back into bytes: ByteLevel, alone or in a Sequence.
void check_decoder(const json& decoder) {
  if (decoder.is_null()) return;
  const std::string type = decoder.at("type").get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& d : decoder.at("decoders")) check_decoder(d);
    return;
  }
  fail("decoder type '", type, "' is not supported (osprey decodes byte-level BPE: ByteLevel)");
}

// A special-token field of tokenizer_config.json: "text" or {"content": "text", ...}.
std::string token_text(const json& config, const char* key) {
  if (!config.contains(key) || config.at(key).is_null()) return {};
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  fail("tokenizer_config.json: ", key, " must be a string or an object with \"content\"");
}

struct Template {
  std::vector<TokenId> prefix, suffix;
};

// Ids the post_processor puts around a single sequence (TemplateProcessing, Roberta/Bert
// processing); ByteLevel adds none.
void read_post_processor(const json& pp, Template& out) {
  if (pp.is_null()) return;
  const std::string type = pp.at("type").get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& p : pp.at("processors")) read_post_processor(p, out);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& specials = pp.value("special_tokens", json::object());
    bool seen_sequence = false;
    for (const json& piece : pp.at("single")) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        const auto name = piece.at("SpecialToken").at("id").get<std::string>();
        if (!specials.contains(name)) {
          fail("post_processor: special token '", name, "' has no entry in special_tokens");
        }
        for (const json& id : specials.at(name).at("ids")) {
          (seen_sequence ? out.suffix : out.prefix).push_back(id.get<TokenId>());
        }
      }
    }
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    out.prefix.push_back(pp.at("cls").at(1).get<TokenId>());
    out.suffix.push_back(pp.at("sep").at(1).get<TokenId>());
    return;
  }
  fail("post_processor type '", type, "' is not supported");
}

}  // namespace

Tokenizer Tokenizer::load(const fs::path& path) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = path / "tokenizer.json";
  if (!fs::exists(file, ec)) {
    fail("no tokenizer at '", path.string(),
         "': pass a tokenizer.json file or a folder that contains one");
  }
  const std::string tokenizer_json = read_file(file, "tokenizer file");
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  std::string config_json;
  if (fs::exists(config_path, ec)) config_json = read_file(config_path, "tokenizer config");
  try {
    return from_json(tokenizer_json, config_json);
  } catch (const Error& e) {
    fail(file.string(), ": ", e.what());
  }
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json,
                               std::string_view tokenizer_config_json) {
  const json root = parse_json(tokenizer_json, "tokenizer.json");
  const json config = tokenizer_config_json.empty()
                          ? json::object()
                          : parse_json(tokenizer_config_json, "tokenizer_config.json");
  if (!root.is_object()) fail("tokenizer.json must hold a JSON object");
  if (!config.is_object()) fail("tokenizer_config.json must hold a JSON object");
  auto impl = std::make_unique<Impl>();
  try {
    if (!root.contains("model")) fail("tokenizer.json has no \"model\" field");
    impl->normalizer = make_normalizer(root.value("normalizer", json()));
    impl->pre_tokenizer = std::make_unique<PreTokenizer>(root.value("pre_tokenizer", json()));
    impl->model = std::make_unique<BpeModel>(root.at("model"));
    check_decoder(root.value("decoder", json()));
    impl->added =
        AddedVocabulary(root.value("added_tokens", json::array()), impl->normalizer.get());
    impl->build_decode_table();
  } catch (const json::exception& e) {
    fail("tokenizer.json is malformed: ", e.what());
  }

  // Special tokens and what encode(add_special_tokens) adds.
  Tokenizer tokenizer(std::move(impl));
  Impl& im = *tokenizer.impl_;
  try {
    im.bos_token = token_text(config, "bos_token");
    im.eos_token = token_text(config, "eos_token");
    if (!im.bos_token.empty()) im.bos_id = tokenizer.token_to_id(im.bos_token);
    if (!im.eos_token.empty()) im.eos_id = tokenizer.token_to_id(im.eos_token);
    const bool has_flags = config.contains("add_bos_token") || config.contains("add_eos_token");
    if (has_flags) {
      // LlamaTokenizerFast-style configs: the flags decide (the post_processor is rebuilt from
      // them by transformers).
      if (config.value("add_bos_token", false)) {
        if (!im.bos_id) fail("tokenizer_config.json sets add_bos_token but bos_token is unknown");
        im.prefix_ids.push_back(*im.bos_id);
      }
      if (config.value("add_eos_token", false)) {
        if (!im.eos_id) fail("tokenizer_config.json sets add_eos_token but eos_token is unknown");
        im.suffix_ids.push_back(*im.eos_id);
      }
    } else {
      Template t;
      read_post_processor(root.value("post_processor", json()), t);
      im.prefix_ids = t.prefix;
      im.suffix_ids = t.suffix;
    }
  } catch (const json::exception& e) {
    fail("tokenizer_config.json or post_processor is malformed: ", e.what());
  }
  for (TokenId id : im.prefix_ids) {
    if (!tokenizer.is_known(id)) fail("special token id ", id, " is not in the vocabulary");
  }
  for (TokenId id : im.suffix_ids) {
    if (!tokenizer.is_known(id)) fail("special token id ", id, " is not in the vocabulary");
  }
  return tokenizer;
}

void Tokenizer::Impl::build_decode_table() {
  TokenId limit = model->id_limit();
  for (const AddedToken& t : added.tokens()) limit = std::max(limit, t.id + 1);
  decode_offsets.assign(limit + 1, 0);
  decode_kind.assign(limit, 0);
  for (TokenId id = 0; id < limit; ++id) {
    decode_offsets[id] = static_cast<uint32_t>(decode_data.size());
    if (const AddedToken* t = added.find(id)) {
      decode_data += t->content;
      decode_kind[id] = t->special ? 3 : 2;
    } else if (auto bytes = model->token_bytes(id)) {
      decode_data += *bytes;
      decode_kind[id] = 1;
    }
  }
  decode_offsets[limit] = static_cast<uint32_t>(decode_data.size());
}

}  // namespace osprey::tokenizer
