#include "engine/tokenizer/utf8.h"

#include <algorithm>

namespace loom {

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Number of bytes of the sequence starting at `pos` that are a valid prefix of a
// well-formed sequence (Unicode Table 3-7), and the length that sequence needs.
// `valid == need` means a complete character; `valid == 0` an invalid lead byte.
struct SequenceCheck {
  size_t valid = 0;
  size_t need = 0;
};

SequenceCheck check_sequence(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {1, 1};
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {0, 1};  // C0, C1, F5..FF, or a stray continuation byte
  }
  size_t valid = 1;
  while (valid < need && pos + valid < s.size()) {
    const auto b = static_cast<uint8_t>(s[pos + valid]);
    const uint8_t min = valid == 1 ? lo : 0x80;
    const uint8_t max = valid == 1 ? hi : 0xBF;
    if (b < min || b > max) break;
    ++valid;
  }
  return {valid, need};
}

}  // namespace

size_t utf8_char_length(std::string_view s, size_t pos) {
  const SequenceCheck c = check_sequence(s, pos);
  return c.valid == c.need ? c.need : 1;
}

size_t utf8_sanitize(std::string_view in, bool final, std::string* out, bool escape) {
  size_t pos = 0;
  while (pos < in.size()) {
    const SequenceCheck c = check_sequence(in, pos);
    if (c.valid == c.need) {
      out->append(in.substr(pos, c.need));
      pos += c.need;
      continue;
    }
    if (c.valid > 0 && pos + c.valid == in.size() && !final) {
      break;  // a prefix of a valid character at the end: wait for the rest
    }
    // Invalid: the maximal subpart (at least one byte) becomes one U+FFFD,
    // or each of its bytes \xNN.
    const size_t n = std::max<size_t>(c.valid, 1);
    if (escape) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      for (size_t i = 0; i < n; ++i) {
        const auto b = static_cast<unsigned char>(in[pos + i]);
        out->append({'\\', 'x', kHex[b >> 4], kHex[b & 15]});
      }
    } else {
      out->append(kUtf8Replacement);
    }
    pos += n;
  }
  return pos;
}

bool utf8_is_valid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const SequenceCheck c = check_sequence(s, pos);
    if (c.valid != c.need) return false;
    pos += c.need;
  }
  return true;
}

}  // namespace loom
