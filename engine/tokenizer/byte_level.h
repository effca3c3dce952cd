// GPT-2's byte <-> unicode mapping for byte-level BPE vocabularies: every byte
// is written as one printable code point (printable ASCII and most of Latin-1
// stand for themselves, the rest are shifted to U+0100..U+0143), so that token
// texts are valid UTF-8 with no spaces or control characters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

/// The code point byte `b` is written as.
uint32_t byte_level_encode(uint8_t b);

/// The byte code point `cp` stands for, or -1 when it is not one of the 256.
int byte_level_decode(uint32_t cp);

/// Appends the bytes a byte-level token text stands for. Characters outside the
/// mapping (not produced by GPT-2 style vocabularies) are copied unchanged.
void byte_level_decode_text(std::string_view text, std::string* out);

}  // namespace loom
