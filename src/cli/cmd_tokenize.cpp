// `osprey tokenize`: encode lines of stdin to JSON arrays of token ids, or (--decode) JSON arrays
// of ids back to text, with the model's tokenizer.json. For checking prompts by hand and for
// comparing osprey's tokenizer with others.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace osprey::cli {
namespace {

namespace tk = osprey::tokenizer;
using nlohmann::json;

struct TokenizeArgs {
  std::string tokenizer_path;
  bool decode = false;
  bool json_input = false;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool literal = false;
  std::string chat;
  bool thinking = false;
  bool no_generation_prompt = false;
};

void write_ids(const std::vector<tk::TokenId>& ids, std::string& out) {
  out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
}

json parse_line_json(const std::string& line, size_t line_no, const char* expected) {
  try {
    return json::parse(line);
  } catch (const json::parse_error&) {
    fail("line ", line_no, ": expected ", expected, ", got: ", line.substr(0, 80));
  }
}

void run_tokenize(const TokenizeArgs& args) {
  const tk::Tokenizer tokenizer = tk::Tokenizer::load(args.tokenizer_path);
  std::optional<tk::ChatEncoder> chat;
  if (!args.chat.empty()) {
    std::filesystem::path dir = args.tokenizer_path;
    if (!std::filesystem::is_directory(dir)) dir = dir.parent_path();
    tk::ChatFormat format;
    if (args.chat == "auto") {
      format = tk::detect_chat_format(dir, tokenizer);
    } else if (auto f = tk::parse_chat_format(args.chat)) {
      format = *f;
    } else {
      fail("unknown chat format '", args.chat,
           "' (expected auto, deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v3.2, simple)");
    }
    chat.emplace(tokenizer, format);
  }
  tk::EncodeOptions encode_options;
  encode_options.add_special_tokens = args.add_special_tokens;
  encode_options.parse_added_tokens = !args.literal;
  tk::DecodeOptions decode_options;
  decode_options.skip_special_tokens = args.skip_special_tokens;
  tk::ChatOptions chat_options;
  chat_options.thinking = args.thinking;
  chat_options.add_generation_prompt = !args.no_generation_prompt;

  std::ios::sync_with_stdio(false);
  std::string line, out;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    out.clear();
    try {
      if (args.decode) {
        const json j = parse_line_json(line, line_no, "a JSON array of token ids");
        if (!j.is_array()) fail("expected a JSON array of token ids");
        std::vector<tk::TokenId> ids;
        for (const json& v : j) {
          if (!v.is_number_integer()) fail("expected a JSON array of token ids");
          const auto id = v.get<int64_t>();
          if (id < INT32_MIN || id > INT32_MAX) fail("token id ", id, " is out of range");
          ids.push_back(static_cast<tk::TokenId>(id));
        }
        out = json(tokenizer.decode(ids, decode_options)).dump() + "\n";
      } else if (chat) {
        const json j = parse_line_json(line, line_no, "a JSON array of chat messages");
        write_ids(chat->encode(tk::parse_chat_messages(j), chat_options), out);
      } else if (args.json_input) {
        const json j = parse_line_json(line, line_no, "a JSON string");
        if (!j.is_string()) fail("expected a JSON string");
        write_ids(tokenizer.encode(j.get<std::string>(), encode_options), out);
      } else {
        write_ids(tokenizer.encode(line, encode_options), out);
      }
    } catch (const Error& e) {
      std::cout.flush();
      fail("line ", line_no, ": ", e.what());
    } catch (const json::exception& e) {
      std::cout.flush();
      fail("line ", line_no, ": ", e.what());
    }
    std::cout << out;
  }
  std::cout.flush();
}

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode each line of stdin to a JSON array of token ids (--decode: the reverse)");
  cmd->add_option("--tokenizer", args->tokenizer_path,
                  "tokenizer.json, or a model folder that contains it")
      ->required();
  cmd->add_flag("--decode", args->decode,
                "read JSON arrays of ids, write each decoded text as a JSON string");
  cmd->add_flag("--json-input", args->json_input,
                "each line is a JSON string (for text with newlines or invalid characters)");
  cmd->add_flag("--add-special-tokens", args->add_special_tokens,
                "add what the tokenizer adds around a text (bos when add_bos_token)");
  cmd->add_flag("--literal", args->literal,
                "treat special-token text in the input as ordinary text");
  cmd->add_flag("--skip-special-tokens", args->skip_special_tokens,
                "--decode: leave special tokens out");
  cmd->add_option("--chat", args->chat,
                  "each line is a JSON array of {role, content} messages, encoded in this chat "
                  "format: auto, deepseek-v3, deepseek-r1, deepseek-v3.1, deepseek-v3.2, simple");
  cmd->add_flag("--thinking", args->thinking, "--chat: thinking mode (deepseek-v3.1/v3.2)");
  cmd->add_flag("--no-generation-prompt", args->no_generation_prompt,
                "--chat: do not end with the assistant's generation prompt");
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace

OSPREY_REGISTER_COMMAND(register_tokenize);

}  // namespace osprey::cli
