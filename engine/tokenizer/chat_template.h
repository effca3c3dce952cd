// Chat templates: turning a conversation into the prompt text a chat model was
// trained on.
//
// A model ships its template as Jinja source (GGUF `tokenizer.chat_template`,
// or `chat_template` in tokenizer_config.json). Loom does not run Jinja: it
// recognises the template's family from its text (Llama 2, Llama 3, ChatML,
// Phi-3, Zephyr, Mistral), reads the details that differ between versions of a
// family out of the template's own string literals (spacing around `[INST]`,
// Qwen's default system prompt, Llama 3.1's date header, ...), and renders the
// conversation in C++. The aim is byte-for-byte the text that Hugging Face
// transformers' `apply_chat_template(..., tokenize=False)` produces with the
// template's defaults, so that tokenizing it (with special tokens parsed) gives
// the ids the model saw in training.
//
// A template that is empty or of no known family falls back to a ChatML-style
// prompt and says so in ChatTemplate::warning(), for the caller to show.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace loom {

/// One turn of a conversation.
struct ChatMessage {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;  ///< UTF-8 text, passed to the template as it is
};

/// The template families Loom knows how to render.
enum class ChatFamily {
  kLlama2,    ///< `[INST]` with `<<SYS>>` folded into the first user turn
  kLlama3,    ///< `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>` (3.0 to 3.3)
  kChatML,    ///< `<|im_start|>role\n...<|im_end|>\n` (Qwen2/2.5, OpenHermes, ...)
  kPhi3,      ///< `<|user|>\n...<|end|>\n` (Phi-3, Phi-3.5)
  kZephyr,    ///< `<|user|>\n...</s>\n` (Zephyr, TinyLlama chat)
  kMistral,   ///< `[INST]` without `<<SYS>>` (v1 `[INST] x [/INST]`, v3/v7 `[INST]x[/INST]`)
  kFallback,  ///< empty or unknown template: a ChatML-style prompt, with a warning
};

/// Short lower-case name of a family ("llama2", "chatml", "fallback", ...).
const char* chat_family_name(ChatFamily family);

/// The family of a Jinja chat template, from marker strings in its text.
/// Empty or unrecognised text gives ChatFamily::kFallback.
ChatFamily detect_chat_family(std::string_view template_text);

/// A recognised chat template, ready to render conversations. Cheap to copy.
///
/// Make one with make_chat_template(); a default-constructed one is the
/// fallback for a model without a template.
class ChatTemplate {
 public:
  /// The fallback template (as for an empty `tokenizer.chat_template`).
  ChatTemplate();

  ChatFamily family() const { return family_; }

  /// Non-empty when apply() may not match what the model's own template would
  /// render: the template was empty or unknown (ChatML-style fallback), or it has
  /// a feature Loom does not reproduce. A sentence for the user; empty otherwise.
  const std::string& warning() const { return warning_; }

  /// The BOS and EOS token texts as the vocabulary spells them (`<s>`,
  /// `<|begin_of_text|>`, `<|endoftext|>`...): the template's `bos_token` and
  /// `eos_token`.
  const std::string& bos_text() const { return bos_text_; }
  const std::string& eos_text() const { return eos_text_; }

  /// True when the template writes bos_text() into its output itself (Llama 2,
  /// Llama 3, Mistral). The caller must then tokenize the prompt without adding
  /// a BOS token of its own, or the model sees two. When false, the caller adds
  /// BOS as the tokenizer's add-BOS setting says.
  bool adds_bos_text() const { return adds_bos_text_; }

  /// False when the template has no place for a system message: Mistral
  /// v0.1/v0.2 reject one (apply() fails), early Phi-3 templates drop it. A
  /// caller can then fold its system prompt into the first user message itself.
  bool supports_system_role() const { return supports_system_role_; }

  /// The system prompt the template inserts when the conversation does not
  /// start with a system message (Qwen2.5: "You are Qwen, created by Alibaba
  /// Cloud. You are a helpful assistant.", Qwen2: "You are a helpful
  /// assistant."); empty when it inserts none. For the user to see what the
  /// model is told; apply() already writes it.
  const std::string& default_system_prompt() const;

  /// "Today Date" written into the system header by Llama 3.1+ templates.
  /// make_chat_template() sets the template's own default ("26 Jul 2024" for
  /// Llama 3.1); empty means the current local date in the template's
  /// "%d %b %Y" form (Llama 3.2 calls `strftime_now`, which transformers
  /// defines). Set it to make prompts reproducible.
  const std::string& date_string() const { return date_string_; }
  void set_date_string(std::string date) { date_string_ = std::move(date); }

  /// Renders a conversation into prompt text.
  ///
  /// @param messages  the turns, oldest first; roles must be "system", "user"
  ///                  or "assistant".
  /// @param add_generation_prompt  append the opening of an assistant turn
  ///                  (`<|im_start|>assistant\n`, ...) so the model answers next;
  ///                  templates that always end ready for an answer (Llama 2,
  ///                  Mistral) ignore it, as their Jinja does.
  /// @return the text, or kInvalidArgument where the model's template would
  ///         raise an error (an unknown role, roles not alternating
  ///         user/assistant in Llama 2 and Mistral, a system message that
  ///         Mistral v0.1/v0.2 does not accept).
  Result<std::string> apply(const std::vector<ChatMessage>& messages,
                            bool add_generation_prompt) const;

  /// What make_chat_template() read from the template text; defined in the .cpp.
  struct Style;

 private:
  friend ChatTemplate make_chat_template(std::string_view, std::string, std::string);

  ChatFamily family_ = ChatFamily::kFallback;
  std::string warning_;
  std::string bos_text_;
  std::string eos_text_;
  std::string date_string_;
  bool adds_bos_text_ = false;
  bool supports_system_role_ = true;
  std::shared_ptr<const Style> style_;  // never null; shared because it never changes
};

/// Recognises `template_text` (a Jinja chat template) and reads its details.
/// Never fails: an empty or unknown template gives the ChatML-style fallback
/// with a warning.
///
/// @param bos_text  the vocabulary's BOS token text (its `bos_token`), "" if none
/// @param eos_text  the vocabulary's EOS token text (its `eos_token`), "" if none
ChatTemplate make_chat_template(std::string_view template_text, std::string bos_text,
                                std::string eos_text);

}  // namespace loom
