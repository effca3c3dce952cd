// UTF-8 helpers shared by the tokenizers and the streaming detokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

/// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr std::string_view kUtf8Replacement = "\xEF\xBF\xBD";

/// Length of the well-formed character at `pos`, or 1 when the bytes there are
/// not one (a stray or truncated sequence is taken byte by byte).
size_t utf8_char_length(std::string_view s, size_t pos);

/// Appends the UTF-8 encoding of code point `cp` (must be <= 0x10FFFF).
void append_utf8(std::string* out, uint32_t cp);

/// Copies the valid UTF-8 of `in` to `out`, replacing each maximal invalid
/// subpart (Unicode's "substitution of maximal subparts") by U+FFFD.
/// With `final` false, an incomplete sequence at the very end that could still
/// become valid is not consumed. Returns the number of bytes of `in` consumed.
/// With `escape`, each invalid byte becomes the text \xNN (hex, upper case)
/// instead, so what the bytes were stays visible.
size_t utf8_sanitize(std::string_view in, bool final, std::string* out, bool escape = false);

/// True when `s` is entirely valid UTF-8.
bool utf8_is_valid(std::string_view s);

}  // namespace loom
