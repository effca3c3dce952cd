// Chat templates without a Jinja engine.
//
// Detection looks for each family's marker tokens. The details then come from
// the template itself: a small scanner walks its `{{ }}` / `{% %}` tags,
// applying the whitespace rules transformers renders with (trim_blocks and
// lstrip_blocks on, `-` markers), keeps track of which `if message['role'] ==
// ...` branch and which `add_generation_prompt` branch each tag sits in, and
// parses the output expressions that are plain concatenations such as
//   '[INST] ' + message['content'] + ' [/INST]'
//   ' ' + message["content"]|trim + eos_token
// Rendering evaluates those expressions, so the spacing of each Mistral, Llama 2,
// Phi-3 and Zephyr variant is the template's own, not a guess. ChatML and
// Llama 3 have fixed layouts; only their defaults (Qwen's system prompt,
// Llama 3.1's date header) are read from the text.
#include "engine/tokenizer/chat_template.h"

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <optional>

namespace loom {

namespace {

// ---- Python's str.strip() ------------------------------------------------
//
// Jinja's `trim` filter and `.strip()` are Python's str.strip(), which removes
// every code point with str.isspace(), not just ASCII blanks.

bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the UTF-8 sequence at s[pos]; returns its length, or 0 when it is not
// a valid sequence (such bytes are never whitespace).
size_t decode_utf8(std::string_view s, size_t pos, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  size_t len = 0;
  uint32_t value = 0;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    value = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    value = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    value = b0 & 0x07;
  } else {
    return 0;
  }
  if (pos + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[pos + k]);
    if ((b & 0xC0) != 0x80) return 0;
    value = (value << 6) | (b & 0x3F);
  }
  *cp = value;
  return len;
}

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    uint32_t cp = 0;
    const size_t len = decode_utf8(s, begin, &cp);
    if (len == 0 || !is_python_space(cp)) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the lead byte of the last character (at most 3 continuation bytes).
    size_t start = end - 1;
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    uint32_t cp = 0;
    const size_t len = decode_utf8(s, start, &cp);
    if (len == 0 || start + len != end || !is_python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim_blanks(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with_word(std::string_view s, std::string_view word) {
  if (s.substr(0, word.size()) != word) return false;
  return s.size() == word.size() || is_blank(s[word.size()]) || s[word.size()] == '(';
}

// ---- Jinja string literals ------------------------------------------------

void append_utf8(uint32_t cp, std::string* out) {
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

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads the quoted literal starting at s[*pos] (a ' or "), advancing past its
// closing quote. Escapes are decoded as Jinja does (Python's unicode-escape:
// \n, \t, \\, \', \", \xhh, \uhhhh, octal, backslash-newline continuation;
// unknown escapes keep their backslash). False when the quote is not closed.
bool read_literal(std::string_view s, size_t* pos, std::string* out) {
  const char quote = s[*pos];
  size_t i = *pos + 1;
  out->clear();
  while (i < s.size() && s[i] != quote) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out->push_back(s[i++]);
      continue;
    }
    const char e = s[i + 1];
    i += 2;
    switch (e) {
      case 'n': out->push_back('\n'); break;
      case 't': out->push_back('\t'); break;
      case 'r': out->push_back('\r'); break;
      case 'f': out->push_back('\f'); break;
      case 'v': out->push_back('\v'); break;
      case 'a': out->push_back('\a'); break;
      case 'b': out->push_back('\b'); break;
      case '\\': out->push_back('\\'); break;
      case '\'': out->push_back('\''); break;
      case '"': out->push_back('"'); break;
      case '\n': break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        size_t k = 0;
        for (; k < digits && i + k < s.size() && hex_value(s[i + k]) >= 0; ++k) {
          cp = cp * 16 + static_cast<uint32_t>(hex_value(s[i + k]));
        }
        if (k != digits || cp > 0x10FFFF) return false;  // Python rejects these too
        append_utf8(cp, out);
        i += digits;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (size_t k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(s[i++] - '0');
          }
          append_utf8(cp, out);
        } else {
          out->push_back('\\');
          out->push_back(e);
        }
    }
  }
  if (i >= s.size()) return false;
  *pos = i + 1;
  return true;
}

// ---- Tags -----------------------------------------------------------------

enum class TagKind { kExpr, kBlock, kComment };

struct Tag {
  TagKind kind = TagKind::kExpr;
  std::string_view body;   // between the delimiters and markers, blanks trimmed
  std::string text_after;  // template text up to the next tag, as rendered
};

// Splits a template into tags and the text between them. The text after each
// tag is what Jinja renders for it under transformers' settings
// (trim_blocks=True, lstrip_blocks=True) and the `-` markers. An unterminated
// tag ends the scan: Jinja would refuse such a template.
std::vector<Tag> scan_tags(std::string_view t) {
  struct Raw {
    TagKind kind;
    size_t begin, end;            // the whole tag, delimiters included
    size_t body_begin, body_end;  // inside the markers
    bool trim_before, trim_after, keep_indent;
  };
  std::vector<Raw> raws;
  size_t i = 0;
  while (i + 1 < t.size()) {
    const char open = t[i + 1];
    if (t[i] != '{' || (open != '{' && open != '%' && open != '#')) {
      ++i;
      continue;
    }
    Raw r{};
    r.kind = open == '{' ? TagKind::kExpr : open == '%' ? TagKind::kBlock : TagKind::kComment;
    r.begin = i;
    size_t j = i + 2;
    if (j < t.size() && (t[j] == '-' || t[j] == '+')) {
      r.trim_before = t[j] == '-';
      r.keep_indent = t[j] == '+';
      ++j;
    }
    r.body_begin = j;
    const char close = open == '{' ? '}' : open;
    int depth = 0;  // brackets inside an expression: `}}` in `{'a': {'b': 1}}` does not close
    bool closed = false;
    std::string scratch;
    while (j < t.size()) {
      const char c = t[j];
      if (r.kind != TagKind::kComment) {
        if (c == '\'' || c == '"') {
          if (!read_literal(t, &j, &scratch)) return {};
          continue;
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) {
          --depth;
          ++j;
          continue;
        }
      }
      if (c == close && depth == 0 && j + 1 < t.size() && t[j + 1] == '}') {
        closed = true;
        break;
      }
      ++j;
    }
    if (!closed) break;
    r.body_end = j;
    if (r.body_end > r.body_begin && t[r.body_end - 1] == '-') {
      r.trim_after = true;
      --r.body_end;
    }
    r.end = j + 2;
    raws.push_back(r);
    i = r.end;
  }

  std::vector<Tag> tags(raws.size());
  for (size_t k = 0; k < raws.size(); ++k) {
    const Raw& r = raws[k];
    tags[k].kind = r.kind;
    tags[k].body = trim_blanks(t.substr(r.body_begin, r.body_end - r.body_begin));
    const size_t text_end = k + 1 < raws.size() ? raws[k + 1].begin : t.size();
    const std::string_view raw = t.substr(r.end, text_end - r.end);
    size_t front = 0;
    size_t back = raw.size();
    // The end first: lstrip_blocks looks at the source line, before trim_blocks
    // has taken the newline that starts it.
    if (k + 1 < raws.size()) {
      const Raw& next = raws[k + 1];
      if (next.trim_before) {
        while (back > 0 && is_blank(raw[back - 1])) --back;
      } else if (next.kind != TagKind::kExpr && !next.keep_indent) {
        // lstrip_blocks: blanks between a line start and a block tag go.
        size_t cut = back;
        while (cut > 0 && (raw[cut - 1] == ' ' || raw[cut - 1] == '\t')) --cut;
        if (cut > 0 && raw[cut - 1] == '\n') back = cut;
      }
    } else if (back > 0 && raw[back - 1] == '\n') {
      --back;  // Jinja drops one trailing newline of the template
    }
    if (r.trim_after) {
      while (front < back && is_blank(raw[front])) ++front;
    } else if (r.kind != TagKind::kExpr) {
      // trim_blocks: the first newline after a block or comment tag goes.
      if (raw.substr(front, 2) == "\r\n" && front + 2 <= back) {
        front += 2;
      } else if (front < back && raw[front] == '\n') {
        ++front;
      }
    }
    const std::string_view text = raw.substr(front, back - front);
    tags[k].text_after = std::string(text);
  }
  return tags;
}

// ---- Concatenation expressions --------------------------------------------

// One operand of a `+` chain in an output expression.
struct Term {
  enum class Kind { kLiteral, kContent, kRole, kSystem, kBos, kEos };
  Kind kind = Kind::kLiteral;
  std::string text;    // kLiteral only
  bool strip = false;  // `| trim` or `.strip()`
};
using Expr = std::vector<Term>;

bool has_term(const Expr& e, Term::Kind kind) {
  for (const Term& t : e) {
    if (t.kind == kind) return true;
  }
  return false;
}

bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Parses `term (+ term)*` where a term is a string literal or one of the names
// the chat templates use for the message text, role, system prompt and special
// tokens, optionally followed by `| trim` or `.strip()`. Anything else (calls,
// indexing by number, other filters) makes the whole expression unreadable:
// nullopt, and the caller ignores the tag.
std::optional<Expr> parse_concat(std::string_view s) {
  size_t i = 0;
  auto skip_blanks = [&] {
    while (i < s.size() && is_blank(s[i])) ++i;
  };
  auto read_ident = [&](std::string* name) {
    const size_t start = i;
    while (i < s.size() && is_ident_char(s[i])) ++i;
    *name = std::string(s.substr(start, i - start));
    return i > start;
  };
  Expr expr;
  while (true) {
    skip_blanks();
    if (i >= s.size()) return std::nullopt;
    Term term;
    if (s[i] == '\'' || s[i] == '"') {
      if (!read_literal(s, &i, &term.text)) return std::nullopt;
    } else {
      std::string path;
      if (!read_ident(&path)) return std::nullopt;
      while (i < s.size()) {
        if (s[i] == '.') {
          ++i;
          std::string member;
          if (!read_ident(&member)) return std::nullopt;
          if (member == "strip" && s.substr(i, 2) == "()") {
            i += 2;
            term.strip = true;
            break;
          }
          path += "." + member;
        } else if (s[i] == '[') {
          ++i;
          skip_blanks();
          std::string key;
          if (i >= s.size() || (s[i] != '\'' && s[i] != '"') || !read_literal(s, &i, &key)) {
            return std::nullopt;
          }
          skip_blanks();
          if (i >= s.size() || s[i] != ']') return std::nullopt;
          ++i;
          path += "." + key;
        } else {
          break;
        }
      }
      if (path == "message.content" || path == "content") {
        term.kind = Term::Kind::kContent;
      } else if (path == "message.role") {
        term.kind = Term::Kind::kRole;
      } else if (path == "system_message") {
        term.kind = Term::Kind::kSystem;
      } else if (path == "bos_token") {
        term.kind = Term::Kind::kBos;
      } else if (path == "eos_token") {
        term.kind = Term::Kind::kEos;
      } else {
        return std::nullopt;
      }
    }
    skip_blanks();
    while (i < s.size() && s[i] == '|') {
      ++i;
      skip_blanks();
      std::string filter;
      if (!read_ident(&filter) || filter != "trim") return std::nullopt;
      if (s.substr(i, 2) == "()") i += 2;
      term.strip = true;
      skip_blanks();
    }
    expr.push_back(std::move(term));
    if (i >= s.size()) return expr;
    if (s[i] != '+') return std::nullopt;
    ++i;
  }
}

// The values an expression's names stand for while rendering one turn.
struct Bindings {
  std::string_view content;
  std::string_view role;
  std::string_view system;
  std::string_view bos;
  std::string_view eos;
};

void append_expr(const Expr& e, const Bindings& b, std::string* out) {
  for (const Term& t : e) {
    std::string_view v;
    switch (t.kind) {
      case Term::Kind::kLiteral: v = t.text; break;
      case Term::Kind::kContent: v = b.content; break;
      case Term::Kind::kRole: v = b.role; break;
      case Term::Kind::kSystem: v = b.system; break;
      case Term::Kind::kBos: v = b.bos; break;
      case Term::Kind::kEos: v = b.eos; break;
    }
    out->append(t.strip ? python_strip(v) : v);
  }
}

// ---- Reading a template's structure ----------------------------------------

// An output expression and the literal text the template writes after it.
struct Piece {
  Expr expr;
  std::string after;
  bool found = false;
};

// The first `role == 'name'` comparison in a condition ("message['role'] ==
// 'user'", "message.role == \"user\""); empty when there is none.
std::string role_compared(std::string_view cond) {
  size_t at = 0;
  while ((at = cond.find("==", at)) != std::string_view::npos) {
    std::string_view left = trim_blanks(cond.substr(0, at));
    while (!left.empty() && (left.back() == ']' || left.back() == '\'' || left.back() == '"')) {
      left.remove_suffix(1);
    }
    at += 2;
    if (left.size() < 4 || left.substr(left.size() - 4) != "role") continue;
    size_t pos = at;
    while (pos < cond.size() && is_blank(cond[pos])) ++pos;
    std::string name;
    if (pos < cond.size() && (cond[pos] == '\'' || cond[pos] == '"') &&
        read_literal(cond, &pos, &name)) {
      return name;
    }
  }
  return {};
}

// Where a tag sits: inside which role branch and add_generation_prompt branch.
struct Branch {
  std::string role;                    // from the innermost condition that names one
  bool gen = false;                    // under `if add_generation_prompt`
  bool no_gen = false;                 // under its `else`
  bool content_check = false;          // the condition also tests the message's content
  bool after_assistant_check = false;  // `messages[-1]['role'] != 'assistant'`
  bool is_else = false;
};

bool tests_generation_prompt(std::string_view cond) {
  return contains(cond, "add_generation_prompt") && !contains(cond, "is defined") &&
         !contains(cond, "not add_generation_prompt");
}

Branch branch_for(std::string_view cond, const Branch& parent) {
  Branch b = parent;
  b.is_else = false;
  b.content_check = false;
  const std::string role = role_compared(cond);
  if (!role.empty()) {
    b.role = role;
    b.content_check = contains(cond, "message['content']") || contains(cond, "message.content") ||
                      contains(cond, "message[\"content\"]");
  }
  if (tests_generation_prompt(cond)) {
    b.gen = true;
    b.after_assistant_check = contains(cond, "messages[-1]") && contains(cond, "assistant");
  }
  return b;
}

// Everything the renderers need from the tags.
struct Scan {
  // Turn expressions by the role branch they are in ("" for none), in order.
  std::vector<std::pair<std::string, Piece>> turns;
  Piece gen;                 // written when add_generation_prompt is set
  bool gen_in_loop = false;  // ... inside the message loop (Zephyr's `loop.last and ...`)
  bool gen_after_assistant_check = false;
  Piece no_gen;        // written when it is not (Phi-3's eos_token)
  Piece bos_alone;     // `{{ bos_token }}` outside the message loop
  Piece system_block;  // uses system_message outside the loop (Mistral v7 [SYSTEM_PROMPT])
  Expr fold;           // `set content = ... system_message ...` (Llama 2 <<SYS>>)
  bool skip_empty_system = false;
  bool else_raises = false;                   // `{% else %}{{ raise_exception(...) }}` in the loop
  bool checks_alternation = false;            // raises "... must alternate ..." over a real list
  std::optional<std::string> system_default;  // `set system_message = '...'`
  std::optional<std::string> date_default;    // `set date_string = "..."`
  std::vector<std::string> literals;          // every string literal in every tag
  std::vector<bool> literal_in_loop;          // ... and whether it sits in a for loop
};

void collect_literals(std::string_view body, bool in_loop, Scan* scan) {
  for (size_t i = 0; i < body.size();) {
    if (body[i] == '\'' || body[i] == '"') {
      std::string lit;
      if (!read_literal(body, &i, &lit)) return;
      scan->literals.push_back(std::move(lit));
      scan->literal_in_loop.push_back(in_loop);
    } else {
      ++i;
    }
  }
}

Scan scan_template(std::string_view text) {
  Scan scan;
  std::vector<Tag> tags = scan_tags(text);
  std::vector<Branch> branches{Branch{}};
  std::vector<std::string> iterables;    // of the enclosing for loops, innermost last
  std::vector<std::string> set_in_loop;  // plain variables assigned inside a loop
  for (const Tag& tag : tags) {
    if (tag.kind == TagKind::kComment) continue;
    const size_t loop_depth = iterables.size();
    collect_literals(tag.body, loop_depth > 0, &scan);
    const Branch& here = branches.back();
    if (tag.kind == TagKind::kBlock) {
      std::string_view body = tag.body;
      if (starts_with_word(body, "for")) {
        // `for message in loop_messages`: remember the list's name.
        const size_t in = body.find(" in ");
        std::string_view list =
            in == std::string_view::npos ? "" : trim_blanks(body.substr(in + 4));
        size_t len = 0;
        while (len < list.size() && is_ident_char(list[len])) ++len;
        iterables.emplace_back(list.substr(0, len));
      } else if (starts_with_word(body, "endfor")) {
        if (!iterables.empty()) iterables.pop_back();
      } else if (starts_with_word(body, "if")) {
        branches.push_back(branch_for(body.substr(2), here));
      } else if (starts_with_word(body, "elif") && branches.size() > 1) {
        branches.back() = branch_for(body.substr(4), branches[branches.size() - 2]);
      } else if (starts_with_word(body, "else") && branches.size() > 1) {
        Branch b = branches[branches.size() - 2];
        b.no_gen = branches.back().gen && !b.gen;
        b.is_else = true;
        branches.back() = b;
      } else if (starts_with_word(body, "endif") && branches.size() > 1) {
        branches.pop_back();
      } else if (starts_with_word(body, "set")) {
        std::string_view rest = trim_blanks(body.substr(3));
        const size_t eq = rest.find('=');
        if (eq == std::string_view::npos) continue;
        const std::string_view name = trim_blanks(rest.substr(0, eq));
        // Jinja scoping: a plain `set` inside a loop is lost when the loop ends
        // (`ns.x` namespace attributes are not).
        if (loop_depth > 0 && name.find('.') == std::string_view::npos) {
          set_in_loop.emplace_back(name);
        }
        std::optional<Expr> value = parse_concat(rest.substr(eq + 1));
        if (!value) continue;
        const bool literal = value->size() == 1 && (*value)[0].kind == Term::Kind::kLiteral;
        if (name == "content" && has_term(*value, Term::Kind::kSystem)) {
          scan.fold = *value;
        } else if (name == "system_message" && literal && !scan.system_default) {
          scan.system_default = (*value)[0].text;
        } else if (name == "date_string" && literal && !scan.date_default) {
          scan.date_default = (*value)[0].text;
        }
      }
      continue;
    }

    // An output expression.
    if (loop_depth > 0 && starts_with_word(tag.body, "raise_exception")) {
      if (here.is_else) scan.else_raises = true;
      if (contains(tag.body, "alternate")) {
        // Mistral Small 3.x checks a list it builds with `set` inside another
        // loop, which Jinja's scoping leaves empty: that check never fires.
        bool lost = false;
        for (const std::string& name : set_in_loop) lost = lost || name == iterables.back();
        if (!lost) scan.checks_alternation = true;
      }
    }
    std::optional<Expr> expr = parse_concat(tag.body);
    if (!expr) continue;
    Piece piece{std::move(*expr), tag.text_after, true};
    const bool has_content = has_term(piece.expr, Term::Kind::kContent);
    const bool has_system = has_term(piece.expr, Term::Kind::kSystem);
    if (loop_depth > 0 && has_content) {
      if (here.role == "system" && here.content_check) scan.skip_empty_system = true;
      scan.turns.emplace_back(here.role, std::move(piece));
    } else if (has_content) {
      continue;  // message text outside any loop: not a shape we know
    } else if (has_system && !scan.system_block.found && loop_depth == 0) {
      scan.system_block = std::move(piece);
    } else if (here.gen && !has_system && !scan.gen.found) {
      scan.gen = std::move(piece);
      scan.gen_in_loop = loop_depth > 0;
      scan.gen_after_assistant_check = here.after_assistant_check;
    } else if (here.no_gen && loop_depth == 0 && !scan.no_gen.found) {
      scan.no_gen = std::move(piece);
    } else if (loop_depth == 0 && piece.expr.size() == 1 &&
               piece.expr[0].kind == Term::Kind::kBos && !scan.bos_alone.found) {
      scan.bos_alone = std::move(piece);
    }
  }
  return scan;
}

// The first turn expression of a role branch: with or without the system
// prompt in it, as asked.
Piece find_turn(const Scan& scan, std::string_view role, bool with_system) {
  for (const auto& [r, piece] : scan.turns) {
    if (r == role && has_term(piece.expr, Term::Kind::kSystem) == with_system) return piece;
  }
  return {};
}

// The standard template of each family whose layout is read from the template
// text, used when a template of that family cannot be read (hand-written or
// unusual ones). From the models' tokenizer_config.json files.
constexpr const char* kCanonicalLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}";
constexpr const char* kCanonicalMistral =
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}";
constexpr const char* kCanonicalPhi3 =
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
constexpr const char* kCanonicalZephyr =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}";

std::string today_string() {
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02d %s %04d", local.tm_mday, kMonths[local.tm_mon % 12],
                local.tm_year + 1900);
  return buf;
}

}  // namespace

// What make_chat_template() read from a template: the family's fixed layout is
// in the render_* functions below, the parts that vary between versions here.
struct ChatTemplate::Style {
  // ChatML
  std::string default_system;           // also the [INST] families' `set system_message = '...'`
  bool default_system_in_loop = false;  // only written when there are messages
  // Llama 3
  std::string knowledge_line;  // "Cutting Knowledge Date: December 2023\n"; empty: no header
  // [INST] families (Llama 2, Mistral)
  Piece user, user_with_system, assistant, system_inline, system_block;
  Expr fold;                    // Llama 2: content of the first turn with the system prompt
  bool fold_into_last = false;  // Mistral v3: system prompt goes with the last user turn
  bool check_alternation = false;
  bool reject_system = false;  // a system message is an error, not dropped
  // Tagged families (Phi-3, Zephyr)
  Piece tagged[3];  // system, user, assistant; empty expr when the role is dropped
  bool skip_empty_system = false;
  Piece gen, no_gen;
  bool gen_in_loop = false;
  bool gen_after_assistant_check = false;
  // Every family
  bool bos_first = false;  // bos_text before everything
};

namespace {

bool is_chatml(std::string_view t) {
  return contains(t, "<|im_start|>") && contains(t, "<|im_end|>") && !contains(t, "<|im_sep|>");
}

// Qwen's "You are Qwen, created by Alibaba Cloud. ..." and Qwen2's "You are a
// helpful assistant.": a literal `<|im_start|>system\n...<|im_end|>` with text.
// Qwen2 writes it inside the message loop, so not for an empty conversation.
std::string chatml_default_system(const Scan& scan, bool* in_loop) {
  static constexpr std::string_view kOpen = "<|im_start|>system\n";
  static constexpr std::string_view kClose = "<|im_end|>";
  for (size_t k = 0; k < scan.literals.size(); ++k) {
    std::string_view v = scan.literals[k];
    *in_loop = scan.literal_in_loop[k];
    if (v.substr(0, kOpen.size()) != kOpen) continue;
    v.remove_prefix(kOpen.size());
    const size_t close = v.find(kClose);
    if (close == std::string_view::npos || close == 0) continue;
    return std::string(v.substr(0, close));
  }
  return {};
}

void read_inst_style(const Scan& scan, ChatTemplate::Style* st) {
  st->user = find_turn(scan, "user", false);
  st->user_with_system = find_turn(scan, "user", true);
  st->assistant = find_turn(scan, "assistant", false);
  st->system_inline = find_turn(scan, "system", false);
  st->system_block = scan.system_block;
  st->fold = scan.fold;
  st->bos_first = scan.bos_alone.found;
  st->reject_system = scan.else_raises;
  if (scan.system_default) st->default_system = *scan.system_default;
}

}  // namespace

const char* chat_family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::kLlama2: return "llama2";
    case ChatFamily::kLlama3: return "llama3";
    case ChatFamily::kChatML: return "chatml";
    case ChatFamily::kPhi3: return "phi3";
    case ChatFamily::kZephyr: return "zephyr";
    case ChatFamily::kMistral: return "mistral";
    case ChatFamily::kFallback: return "fallback";
  }
  return "unknown";
}

ChatFamily detect_chat_family(std::string_view t) {
  if (contains(t, "<|start_header_id|>") && contains(t, "<|eot_id|>")) return ChatFamily::kLlama3;
  if (is_chatml(t)) return ChatFamily::kChatML;
  if (contains(t, "[INST]")) {
    return contains(t, "<<SYS>>") ? ChatFamily::kLlama2 : ChatFamily::kMistral;
  }
  const bool role_tags = contains(t, "<|user|>") || contains(t, "'<|' + message['role'] + '|>'");
  if (role_tags && contains(t, "<|end|>")) return ChatFamily::kPhi3;
  if (contains(t, "<|user|>") && contains(t, "<|assistant|>")) return ChatFamily::kZephyr;
  return ChatFamily::kFallback;
}

ChatTemplate::ChatTemplate()
    : warning_(
          "the model has no chat template; using a generic ChatML-style prompt, which the "
          "model may not follow well"),
      style_(std::make_shared<const Style>()) {}

const std::string& ChatTemplate::default_system_prompt() const {
  return style_->default_system;
}

ChatTemplate make_chat_template(std::string_view template_text, std::string bos_text,
                                std::string eos_text) {
  ChatTemplate ct;
  ct.bos_text_ = std::move(bos_text);
  ct.eos_text_ = std::move(eos_text);
  ct.family_ = detect_chat_family(template_text);
  if (ct.family_ == ChatFamily::kFallback) {
    if (!trim_blanks(template_text).empty()) {
      ct.warning_ =
          "the model's chat template is not one Loom recognises; using a generic ChatML-style "
          "prompt, which may not match what the model was trained on";
    }
    return ct;
  }
  ct.warning_.clear();

  auto style = std::make_shared<ChatTemplate::Style>();
  const Scan scan = scan_template(template_text);
  const char* canonical = nullptr;
  switch (ct.family_) {
    case ChatFamily::kChatML:
      style->default_system = chatml_default_system(scan, &style->default_system_in_loop);
      style->bos_first = scan.bos_alone.found;
      break;
    case ChatFamily::kLlama3:
      for (const std::string& lit : scan.literals) {
        if (lit.rfind("Cutting Knowledge Date:", 0) == 0) {
          style->knowledge_line = lit;
          break;
        }
      }
      style->bos_first = contains(template_text, "bos_token");
      if (!style->knowledge_line.empty()) {
        // Templates that call strftime_now get today's date from transformers;
        // the literal is only their fallback when the function is missing.
        if (!contains(template_text, "strftime_now")) {
          ct.date_string_ = scan.date_default.value_or("26 Jul 2024");
        }
      }
      break;
    case ChatFamily::kLlama2:
    case ChatFamily::kMistral:
      read_inst_style(scan, style.get());
      if (!style->user.found || !style->assistant.found) {
        canonical = ct.family_ == ChatFamily::kLlama2 ? kCanonicalLlama2 : kCanonicalMistral;
      }
      break;
    case ChatFamily::kPhi3:
    case ChatFamily::kZephyr: {
      static constexpr std::string_view kRoles[3] = {"system", "user", "assistant"};
      const Piece generic = find_turn(scan, "", false);
      for (int r = 0; r < 3; ++r) {
        style->tagged[r] = find_turn(scan, kRoles[r], false);
        if (!style->tagged[r].found) style->tagged[r] = generic;
      }
      style->skip_empty_system = scan.skip_empty_system;
      style->gen = scan.gen;
      style->gen_in_loop = scan.gen_in_loop;
      style->gen_after_assistant_check = scan.gen_after_assistant_check;
      style->no_gen = scan.no_gen;
      style->bos_first = scan.bos_alone.found;
      if (!style->tagged[1].found || !style->tagged[2].found) {
        canonical = ct.family_ == ChatFamily::kPhi3 ? kCanonicalPhi3 : kCanonicalZephyr;
      }
      break;
    }
    case ChatFamily::kFallback: break;
  }

  if (canonical != nullptr) {
    // Could not read this template's layout: use the family's standard one.
    ChatTemplate standard = make_chat_template(canonical, ct.bos_text_, ct.eos_text_);
    standard.warning_ = std::string("Loom could not read the exact layout of this ") +
                        chat_family_name(ct.family_) + " chat template; using the standard " +
                        chat_family_name(ct.family_) + " layout, which may differ slightly";
    return standard;
  }

  if (ct.family_ == ChatFamily::kLlama2 || ct.family_ == ChatFamily::kMistral) {
    style->check_alternation = scan.checks_alternation;
    style->fold_into_last = contains(template_text, "loop.last and system_message");
    if (contains(template_text, "default_system_message")) {
      ct.warning_ =
          "this Mistral template builds a default system prompt that Loom does not reproduce; "
          "give the conversation a system message to match the model's own prompt exactly";
    }
    ct.supports_system_role_ = style->user_with_system.found || style->system_block.found ||
                               style->system_inline.found || !style->fold.empty();
  }
  if (ct.family_ == ChatFamily::kPhi3 || ct.family_ == ChatFamily::kZephyr) {
    ct.supports_system_role_ = style->tagged[0].found;
  }
  // Llama 2's official template writes bos_token before every user turn.
  const bool user_has_bos = has_term(style->user.expr, Term::Kind::kBos);
  ct.adds_bos_text_ = style->bos_first || user_has_bos;
  ct.style_ = std::move(style);
  return ct;
}

namespace {

Status role_error(size_t index, const std::string& role) {
  return make_error(ErrorCode::kInvalidArgument,
                    "chat message %zu has role '%s'; chat templates take 'system', 'user' "
                    "and 'assistant'",
                    index, role.c_str());
}

void render_chatml(const ChatTemplate::Style& st, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt, std::string_view bos, std::string* out) {
  if (st.bos_first) out->append(bos);
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!st.default_system.empty() && !system_first &&
      !(st.default_system_in_loop && messages.empty())) {
    *out += "<|im_start|>system\n" + st.default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    *out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) *out += "<|im_start|>assistant\n";
}

void render_llama3(const ChatTemplate::Style& st, const std::string& date,
                   const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                   std::string_view bos, std::string* out) {
  size_t first = 0;
  if (!st.knowledge_line.empty()) {
    // 3.1+: a system header always comes first, holding the system prompt if any.
    if (st.bos_first) out->append(bos);
    std::string_view system;
    if (!messages.empty() && messages[0].role == "system") {
      system = python_strip(messages[0].content);
      first = 1;
    }
    *out += "<|start_header_id|>system<|end_header_id|>\n\n";
    *out += st.knowledge_line;
    *out += "Today Date: " + (date.empty() ? today_string() : date) + "\n\n";
    out->append(system);
    *out += "<|eot_id|>";
  } else if (st.bos_first && !messages.empty()) {
    out->append(bos);  // 3.0 writes it with the first message
  }
  for (size_t i = first; i < messages.size(); ++i) {
    *out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
    out->append(python_strip(messages[i].content));
    *out += "<|eot_id|>";
  }
  if (add_generation_prompt) *out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

void append_piece(const Piece& p, const Bindings& b, std::string* out) {
  append_expr(p.expr, b, out);
  *out += p.after;
}

Status render_inst(const ChatTemplate::Style& st, ChatFamily family,
                   const std::vector<ChatMessage>& messages, std::string_view bos,
                   std::string_view eos, std::string* out) {
  // The leading system message, where the template takes one out of the turns.
  const bool takes_system = st.user_with_system.found || st.system_block.found || !st.fold.empty();
  std::optional<std::string_view> system;
  size_t first = 0;
  if (takes_system && !messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  } else if (takes_system && !st.default_system.empty()) {
    system = st.default_system;
  }
  const size_t n = messages.size() - first;
  if (st.check_alternation) {
    for (size_t i = 0; i < n; ++i) {
      const ChatMessage& m = messages[first + i];
      if ((m.role == "user") != (i % 2 == 0)) {
        return make_error(ErrorCode::kInvalidArgument,
                          "the %s chat template needs user and assistant messages to alternate, "
                          "starting with user (after an optional first system message); "
                          "message %zu is '%s'",
                          chat_family_name(family), first + i, m.role.c_str());
      }
    }
  }
  Bindings b;
  b.bos = bos;
  b.eos = eos;
  if (system) b.system = *system;
  if (st.bos_first) out->append(bos);
  if (st.system_block.found && system) append_piece(st.system_block, b, out);
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[first + i];
    b.role = m.role;
    b.content = m.content;
    std::string folded;
    if (!st.fold.empty() && system && i == 0) {
      // Llama 2: `set content = '<<SYS>>\n' + system_message + ... + message['content']`.
      append_expr(st.fold, b, &folded);
      b.content = folded;
    }
    if (m.role == "user") {
      const bool with_system =
          st.user_with_system.found && system && (st.fold_into_last ? i + 1 == n : i == 0);
      append_piece(with_system ? st.user_with_system : st.user, b, out);
    } else if (m.role == "assistant") {
      append_piece(st.assistant, b, out);
    } else if (st.system_inline.found) {
      append_piece(st.system_inline, b, out);
    } else if (st.reject_system) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the %s chat template takes no system message%s (message %zu)",
                        chat_family_name(family),
                        takes_system ? " except as the first message" : "", first + i);
    }
    // Otherwise the template writes nothing for this message, and neither do we.
  }
  return Status::ok_status();
}

void render_tagged(const ChatTemplate::Style& st, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt, std::string_view bos, std::string_view eos,
                   std::string* out) {
  Bindings b;
  b.bos = bos;
  b.eos = eos;
  if (st.bos_first) out->append(bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const int r = m.role == "system" ? 0 : m.role == "user" ? 1 : 2;
    const bool skip = r == 0 && st.skip_empty_system && m.content.empty();
    if (st.tagged[r].found && !skip) {
      b.role = m.role;
      b.content = m.content;
      append_piece(st.tagged[r], b, out);
    }
    if (st.gen_in_loop && add_generation_prompt && i + 1 == messages.size() && st.gen.found) {
      append_piece(st.gen, b, out);
    }
  }
  if (st.gen_in_loop) return;
  const bool last_is_assistant = !messages.empty() && messages.back().role == "assistant";
  if (add_generation_prompt && !(st.gen_after_assistant_check && last_is_assistant)) {
    if (st.gen.found) append_piece(st.gen, b, out);
  } else if (!add_generation_prompt && st.no_gen.found) {
    append_piece(st.no_gen, b, out);
  }
}

}  // namespace

Result<std::string> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") return role_error(i, role);
  }
  std::string out;
  switch (family_) {
    case ChatFamily::kChatML:
    case ChatFamily::kFallback:
      render_chatml(*style_, messages, add_generation_prompt, bos_text_, &out);
      break;
    case ChatFamily::kLlama3:
      render_llama3(*style_, date_string_, messages, add_generation_prompt, bos_text_, &out);
      break;
    case ChatFamily::kLlama2:
    case ChatFamily::kMistral:
      LOOM_TRY(render_inst(*style_, family_, messages, bos_text_, eos_text_, &out));
      break;
    case ChatFamily::kPhi3:
    case ChatFamily::kZephyr:
      render_tagged(*style_, messages, add_generation_prompt, bos_text_, eos_text_, &out);
      break;
  }
  return out;
}

}  // namespace loom
