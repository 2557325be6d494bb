#include "tokenizer/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

namespace osprey::tokenizer {
namespace {

// Python's repr(float) writes fixed notation for decimal exponents in [-4, 16), else scientific
// with a sign and at least two exponent digits; the digits are the shortest that round-trip.
constexpr int kReprMinFixedExponent = -4;
constexpr int kReprMaxFixedExponent = 16;

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void dump_float(double v, std::string& out) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  const bool negative = sci[0] == '-';
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  if (negative) out += '-';
  if (exponent >= kReprMinFixedExponent && exponent < kReprMaxFixedExponent) {
    if (exponent < 0) {
      out += "0.";
      out.append(size_t(-exponent - 1), '0');
      out += digits;
    } else if (size_t(exponent) + 1 >= digits.size()) {
      out += digits;
      out.append(size_t(exponent) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, size_t(exponent) + 1);
      out += '.';
      out += digits.substr(size_t(exponent) + 1);
    }
    return;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out += eb;
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out += '}';
      return;
    }
    case nlohmann::json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& x : v) {
        if (!first) out += ", ";
        first = false;
        dump(x, out);
      }
      out += ']';
      return;
    }
    case nlohmann::json::value_t::string:
      dump_string(v.get_ref<const std::string&>(), out);
      return;
    case nlohmann::json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case nlohmann::json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      return;
    case nlohmann::json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      return;
    case nlohmann::json::value_t::number_float:
      dump_float(v.get<double>(), out);
      return;
    default:
      out += "null";
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace osprey::tokenizer
