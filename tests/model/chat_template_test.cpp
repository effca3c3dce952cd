// Chat templates of real models, from ../shared/fixtures: Qwen2.5, Llama 3.1,
// Llama 3.2 and Phi-3.5 (chat-templates/*.jinja, copied from each model's
// tokenizer_config.json), Phi-3-mini's tokenizer_config.json, and the template
// stored in a real GGUF (llama.cpp's Phi-3 vocab file). Each expected prompt is
// what transformers' apply_chat_template renders for the template and
// conversation (Jinja with trim_blocks and lstrip_blocks), rendered by hand and
// checked against Jinja2.
#include "engine/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <cctype>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "tests/test_util.h"

namespace loom {
namespace {

std::string read_text(const std::string& path) {
  std::vector<uint8_t> bytes = test::read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

// Skips when the fixture is absent, like LOOM_FIXTURE_OR_SKIP, and yields the
// template text.
#define LOOM_TEMPLATE_OR_SKIP(var, name)                    \
  LOOM_FIXTURE_OR_SKIP(var##_path, "chat-templates/" name); \
  const std::string var = read_text(var##_path)

std::string render(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen) {
  Result<std::string> r = t.apply(messages, gen);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::string("<error: ") + r.message() + ">";
}

const std::vector<ChatMessage> kChat = {
    {"system", "You are a helpful assistant."},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you?"},
};

// ---- Qwen2.5 -----------------------------------------------------------------

TEST(ChatTemplateFixtures, Qwen25) {
  LOOM_TEMPLATE_OR_SKIP(text, "Qwen-Qwen2.5-7B-Instruct.jinja");
  ChatTemplate t = make_chat_template(text, "", "<|im_end|>");
  EXPECT_EQ(t.family(), ChatFamily::kChatML);
  EXPECT_EQ(t.warning(), "");
  EXPECT_FALSE(t.adds_bos_text());
  EXPECT_EQ(t.default_system_prompt(),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");

  const std::string turns =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there<|im_end|>\n"
      "<|im_start|>user\nWho are you?<|im_end|>\n";
  EXPECT_EQ(render(t, kChat, false), turns);
  EXPECT_EQ(render(t, kChat, true), turns + "<|im_start|>assistant\n");

  // Without a system message Qwen2.5 introduces itself.
  EXPECT_EQ(render(t, {{"user", "Hello"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  // An empty system message is still the system message: no default, no trimming.
  EXPECT_EQ(render(t, {{"system", ""}, {"user", " Hello "}}, true),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n Hello <|im_end|>\n"
            "<|im_start|>assistant\n");
  // A later system message is written where it is.
  EXPECT_EQ(
      render(t, {{"user", "a"}, {"system", "b"}}, false),
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n");
}

// ---- Llama 3.1 / 3.2 -----------------------------------------------------------

TEST(ChatTemplateFixtures, Llama31) {
  LOOM_TEMPLATE_OR_SKIP(text, "meta-llama-Llama-3.1-8B-Instruct.jinja");
  ChatTemplate t = make_chat_template(text, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(t.family(), ChatFamily::kLlama3);
  EXPECT_EQ(t.warning(), "");
  // The template writes <|begin_of_text|> itself: the caller must not add one.
  EXPECT_TRUE(t.adds_bos_text());
  EXPECT_EQ(t.date_string(), "26 Jul 2024");

  const std::string header =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
  const std::string turns =
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>";
  const std::string gen = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(render(t, kChat, true),
            header + "You are a helpful assistant.<|eot_id|>" + turns + gen);
  EXPECT_EQ(render(t, kChat, false), header + "You are a helpful assistant.<|eot_id|>" + turns);

  // No system message: the header block is still there, with nothing after the date.
  EXPECT_EQ(render(t, {{"user", "Hello"}}, true),
            header + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>" + gen);
  // Empty, or blank, system messages give the same header.
  EXPECT_EQ(render(t, {{"system", " \n"}, {"user", "Hello"}}, false),
            header + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>");
  // Every text is trimmed (`| trim`), the system prompt too.
  EXPECT_EQ(render(t, {{"system", "\n Be brief. \n"}, {"user", "  Hi\n\n"}}, false),
            header + "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplateFixtures, Llama32DateComesFromTheClock) {
  LOOM_TEMPLATE_OR_SKIP(text, "meta-llama-Llama-3.2-3B-Instruct.jinja");
  ChatTemplate t = make_chat_template(text, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(t.family(), ChatFamily::kLlama3);
  EXPECT_TRUE(t.adds_bos_text());
  // 3.2 calls strftime_now("%d %b %Y"), which transformers defines: today's date.
  EXPECT_EQ(t.date_string(), "");
  Result<std::string> today = t.apply({{"user", "Hello"}}, true);
  ASSERT_TRUE(today.ok()) << today.message();
  const std::string prefix =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: ";
  ASSERT_EQ(today->substr(0, prefix.size()), prefix);
  const std::string date = today->substr(prefix.size(), 11);  // "02 Dec 2026"
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(date[0])) &&
              std::isdigit(static_cast<unsigned char>(date[1])) && date[2] == ' ' &&
              date[6] == ' ' && std::isdigit(static_cast<unsigned char>(date[10])))
      << date;
  EXPECT_EQ(today->substr(prefix.size() + 11, 2), "\n\n");

  // A fixed date makes the prompt reproducible.
  t.set_date_string("01 Jan 2025");
  EXPECT_EQ(render(t, kChat, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n"
            "You are a helpful assistant.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// ---- Phi-3 / Phi-3.5 -------------------------------------------------------------

TEST(ChatTemplateFixtures, Phi35) {
  LOOM_TEMPLATE_OR_SKIP(text, "microsoft-Phi-3.5-mini-instruct.jinja");
  ChatTemplate t = make_chat_template(text, "<s>", "<|endoftext|>");
  EXPECT_EQ(t.family(), ChatFamily::kPhi3);
  EXPECT_EQ(t.warning(), "");
  EXPECT_FALSE(t.adds_bos_text());
  EXPECT_TRUE(t.supports_system_role());

  const std::string turns =
      "<|system|>\nYou are a helpful assistant.<|end|>\n"
      "<|user|>\nHello<|end|>\n"
      "<|assistant|>\nHi there<|end|>\n"
      "<|user|>\nWho are you?<|end|>\n";
  EXPECT_EQ(render(t, kChat, true), turns + "<|assistant|>\n");
  // Without the generation prompt the template closes with eos_token.
  EXPECT_EQ(render(t, kChat, false), turns + "<|endoftext|>");
  // 3.5 skips a system message whose content is empty (3-mini writes it).
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "Hello"}}, true),
            "<|user|>\nHello<|end|>\n<|assistant|>\n");
  // ... but not a blank one: Jinja tests the string, it does not trim it.
  EXPECT_EQ(render(t, {{"system", " "}, {"user", "Hello "}}, true),
            "<|system|>\n <|end|>\n<|user|>\nHello <|end|>\n<|assistant|>\n");
}

TEST(ChatTemplateFixtures, Phi3MiniTokenizerConfig) {
  LOOM_FIXTURE_OR_SKIP(path, "tokenizers/phi-3-mini/tokenizer_config.json");
  const nlohmann::json config = nlohmann::json::parse(read_text(path));
  ChatTemplate t = make_chat_template(config.at("chat_template").get<std::string>(),
                                      config.at("bos_token").get<std::string>(),
                                      config.at("eos_token").get<std::string>());
  EXPECT_EQ(t.family(), ChatFamily::kPhi3);
  EXPECT_EQ(t.warning(), "");
  EXPECT_FALSE(t.adds_bos_text());
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "Hello"}}, false),
            "<|system|>\n<|end|>\n<|user|>\nHello<|end|>\n<|endoftext|>");
}

// The template as a GGUF stores it, with BOS/EOS texts from the same file's vocab.
TEST(ChatTemplateFixtures, Phi3FromGguf) {
  LOOM_FIXTURE_OR_SKIP(path, "llama.cpp-vocab/ggml-vocab-phi-3.gguf");
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.message();
  const GgufFile& f = **file;
  auto text = f.get_string("tokenizer.chat_template");
  ASSERT_TRUE(text.ok() && text->has_value());
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  auto bos_id = f.get_int("tokenizer.ggml.bos_token_id");
  auto eos_id = f.get_int("tokenizer.ggml.eos_token_id");
  ASSERT_TRUE(tokens.ok() && bos_id.ok() && bos_id->has_value() && eos_id.ok() &&
              eos_id->has_value());
  const std::vector<std::string>& vocab = **tokens;
  ASSERT_LT(static_cast<size_t>(**bos_id), vocab.size());
  ASSERT_LT(static_cast<size_t>(**eos_id), vocab.size());

  ChatTemplate t = make_chat_template(**text, vocab[static_cast<size_t>(**bos_id)],
                                      vocab[static_cast<size_t>(**eos_id)]);
  EXPECT_EQ(t.family(), ChatFamily::kPhi3);
  EXPECT_EQ(t.warning(), "");
  EXPECT_EQ(t.bos_text(), "<s>");
  // This (earlier) Phi-3 template writes BOS, drops system messages and opens
  // the assistant's turn after every user turn.
  EXPECT_TRUE(t.adds_bos_text());
  EXPECT_FALSE(t.supports_system_role());
  EXPECT_EQ(render(t, kChat, true),
            "<s><|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
            "<|user|>\nWho are you?<|end|>\n<|assistant|>\n");
}

}  // namespace
}  // namespace loom
