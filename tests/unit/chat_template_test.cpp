// Chat templates of the families without a fixture file, embedded as data:
// Llama 2, Llama 3.0, plain ChatML, Qwen2, Zephyr, Phi-3 and Mistral
// (v0.1, v0.2, v3, v3-tekken, v7). The strings are the models' own
// `chat_template` values as tokenizer_config.json holds them (JSON escapes kept:
// "\n" is a newline in the template, "\\n" Jinja's escape inside a literal).
// Every expected prompt is what transformers' apply_chat_template renders for
// that template and conversation (Jinja with trim_blocks and lstrip_blocks).
#include "engine/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom {
namespace {

// teknium/OpenHermes-2.5-Mistral-7B
constexpr const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";

// Qwen/Qwen2-7B-Instruct
constexpr const char* kQwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' "
    "+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// meta-llama/Llama-2-7b-chat-hf
constexpr const char* kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== "
    "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
    "false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% "
    "endfor %}";

// meta-llama/Meta-Llama-3-8B-Instruct (3.0: no date header)
constexpr const char* kLlama30 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ "
    "content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// HuggingFaceH4/zephyr-7b-beta (also TinyLlama-1.1B-Chat-v1.0)
constexpr const char* kZephyr =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' "
    "+ "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ "
    "'<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and "
    "add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

// microsoft/Phi-3-mini-4k-instruct (system messages written, even empty ones)
constexpr const char* kPhi3Mini =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' "
    "%}{{'<|assistant|>\n' "
    "+ message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

// An earlier Phi-3-mini revision: BOS, system messages dropped, every user turn
// opens the assistant's.
constexpr const char* kPhi3Legacy =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' "
    "+ "
    "'\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif "
    "(message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% "
    "endfor %}";

// mistralai/Mistral-7B-Instruct-v0.1
constexpr const char* kMistralV01 =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 "
    "% "
    "2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' "
    "+ message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

// mistralai/Mixtral-8x7B-Instruct-v0.1 and Mistral-7B-Instruct-v0.2 (v1 spacing)
constexpr const char* kMistralV02 =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 "
    "% "
    "2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' "
    "+ message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

// Mistral's v3 template (Mistral-7B-Instruct-v0.3, Mistral-Large-2407): the
// system prompt goes with the last user turn, `[INST] x[/INST]`, tools support.
constexpr const char* kMistralV3 = R"jinja({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)jinja";

// Mistral's v3-tekken template (Mistral-Nemo-Instruct-2407), the parts that
// matter here: `[INST]x[/INST]` with no spaces, assistant text untrimmed.
constexpr const char* kMistralV3Tekken = R"jinja({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)jinja";

// mistralai/Mistral-Large-Instruct-2411 (v7): system prompts in place.
constexpr const char* kMistralV7 =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' "
    "+ "
    "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
    "message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}";

// google/gemma-7b-it: not a family Loom knows.
constexpr const char* kGemma =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% "
    "set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
    "'<start_of_turn>' "
    "+ role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

// microsoft/phi-4: <|im_start|> but not ChatML (<|im_sep|> instead of a newline).
constexpr const char* kPhi4 =
    "{% for message in messages %}{% if (message['role'] == 'system') "
    "%}{{'<|im_start|>system<|im_sep|>' "
    "+ message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') "
    "%}{{'<|im_start|>user<|im_sep|>' + message['content'] + "
    "'<|im_end|><|im_start|>assistant<|im_sep|>'}}{% elif (message['role'] == 'assistant') "
    "%}{{message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}";

const std::vector<ChatMessage> kChat = {
    {"system", "You are a helpful assistant."},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you?"},
};

const std::vector<ChatMessage> kChatNoSystem = {
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you?"},
};

std::string render(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen) {
  Result<std::string> r = t.apply(messages, gen);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::string("<error: ") + r.message() + ">";
}

// ---- Detection --------------------------------------------------------------

struct DetectCase {
  const char* name;
  const char* text;
  ChatFamily family;
};

class DetectTest : public ::testing::TestWithParam<DetectCase> {};

TEST_P(DetectTest, RecognisesFamily) {
  const DetectCase& c = GetParam();
  EXPECT_EQ(detect_chat_family(c.text), c.family) << c.name;
  ChatTemplate t = make_chat_template(c.text, "<s>", "</s>");
  EXPECT_EQ(t.family(), c.family) << c.name;
  // A recognised template renders exactly, so there is nothing to warn about.
  if (c.family != ChatFamily::kFallback) {
    EXPECT_EQ(t.warning(), "") << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EmbeddedTemplates, DetectTest,
    ::testing::Values(DetectCase{"chatml", kChatML, ChatFamily::kChatML},
                      DetectCase{"qwen2", kQwen2, ChatFamily::kChatML},
                      DetectCase{"llama2", kLlama2, ChatFamily::kLlama2},
                      DetectCase{"llama30", kLlama30, ChatFamily::kLlama3},
                      DetectCase{"zephyr", kZephyr, ChatFamily::kZephyr},
                      DetectCase{"phi3_mini", kPhi3Mini, ChatFamily::kPhi3},
                      DetectCase{"phi3_legacy", kPhi3Legacy, ChatFamily::kPhi3},
                      DetectCase{"mistral_v01", kMistralV01, ChatFamily::kMistral},
                      DetectCase{"mistral_v02", kMistralV02, ChatFamily::kMistral},
                      DetectCase{"mistral_v3", kMistralV3, ChatFamily::kMistral},
                      DetectCase{"mistral_v3_tekken", kMistralV3Tekken, ChatFamily::kMistral},
                      DetectCase{"mistral_v7", kMistralV7, ChatFamily::kMistral},
                      DetectCase{"gemma", kGemma, ChatFamily::kFallback},
                      DetectCase{"phi4", kPhi4, ChatFamily::kFallback},
                      DetectCase{"empty", "", ChatFamily::kFallback}),
    [](const ::testing::TestParamInfo<DetectCase>& param) {
      return std::string(param.param.name);
    });

TEST(ChatFamilyName, EveryFamilyHasAName) {
  EXPECT_STREQ(chat_family_name(ChatFamily::kLlama2), "llama2");
  EXPECT_STREQ(chat_family_name(ChatFamily::kLlama3), "llama3");
  EXPECT_STREQ(chat_family_name(ChatFamily::kChatML), "chatml");
  EXPECT_STREQ(chat_family_name(ChatFamily::kPhi3), "phi3");
  EXPECT_STREQ(chat_family_name(ChatFamily::kZephyr), "zephyr");
  EXPECT_STREQ(chat_family_name(ChatFamily::kMistral), "mistral");
  EXPECT_STREQ(chat_family_name(ChatFamily::kFallback), "fallback");
}

// ---- Fallback -----------------------------------------------------------------

TEST(ChatTemplateFallback, EmptyTemplateWarnsAndUsesChatML) {
  ChatTemplate t = make_chat_template("", "<s>", "</s>");
  EXPECT_EQ(t.family(), ChatFamily::kFallback);
  EXPECT_NE(t.warning(), "");
  EXPECT_NE(t.warning().find("no chat template"), std::string::npos) << t.warning();
  EXPECT_FALSE(t.adds_bos_text());
  EXPECT_EQ(render(t, {{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateFallback, UnknownTemplateWarnsAndUsesChatML) {
  ChatTemplate t = make_chat_template(kGemma, "<bos>", "<eos>");
  EXPECT_EQ(t.family(), ChatFamily::kFallback);
  EXPECT_NE(t.warning().find("not one Loom recognises"), std::string::npos) << t.warning();
  EXPECT_EQ(render(t, kChat, false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there<|im_end|>\n"
            "<|im_start|>user\nWho are you?<|im_end|>\n");
}

TEST(ChatTemplateFallback, DefaultConstructedIsTheNoTemplateFallback) {
  ChatTemplate t;
  EXPECT_EQ(t.family(), ChatFamily::kFallback);
  EXPECT_NE(t.warning(), "");
  EXPECT_EQ(render(t, {{"user", "Hi"}}, false), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateFallback, UnreadableTemplateOfAKnownFamilyUsesItsStandardLayout) {
  // Mistral markers, but no expression Loom can read: the standard v0.2 layout.
  ChatTemplate t = make_chat_template(
      "{{ bos_token }}{% for m in messages %}{{ '[INST] ' ~ m.content ~ ' [/INST]' }}{% endfor %}",
      "<s>", "</s>");
  EXPECT_EQ(t.family(), ChatFamily::kMistral);
  EXPECT_NE(t.warning().find("standard mistral layout"), std::string::npos) << t.warning();
  EXPECT_EQ(render(t, kChatNoSystem, true),
            "<s>[INST] Hello [/INST]Hi there</s>[INST] Who are you? [/INST]");
}

// ---- Roles ------------------------------------------------------------------

TEST(ChatTemplateRoles, UnknownRoleIsAnError) {
  ChatTemplate t = make_chat_template(kChatML, "", "");
  Result<std::string> r = t.apply({{"user", "x"}, {"tool", "{}"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message().find("message 1 has role 'tool'"), std::string::npos) << r.message();
}

// ---- ChatML -----------------------------------------------------------------

TEST(ChatTemplateChatML, MultiTurnWithAndWithoutGenerationPrompt) {
  ChatTemplate t = make_chat_template(kChatML, "<s>", "<|im_end|>");
  EXPECT_EQ(t.family(), ChatFamily::kChatML);
  EXPECT_FALSE(t.adds_bos_text());
  EXPECT_EQ(t.default_system_prompt(), "");
  const std::string turns =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there<|im_end|>\n"
      "<|im_start|>user\nWho are you?<|im_end|>\n";
  EXPECT_EQ(render(t, kChat, false), turns);
  EXPECT_EQ(render(t, kChat, true), turns + "<|im_start|>assistant\n");
  // No system message, none added; text kept as it is (no trimming).
  EXPECT_EQ(render(t, {{"user", "  spaced  "}}, true),
            "<|im_start|>user\n  spaced  <|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateChatML, Qwen2InsertsItsDefaultSystemPrompt) {
  ChatTemplate t = make_chat_template(kQwen2, "", "<|im_end|>");
  EXPECT_EQ(t.default_system_prompt(), "You are a helpful assistant.");
  EXPECT_EQ(render(t, {{"user", "Hello"}}, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\n");
  // A system message replaces it, even an empty one.
  EXPECT_EQ(render(t, {{"system", "Be brief."}, {"user", "Hello"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n");
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "Hello"}}, false),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n");
  // Qwen2 writes it inside the message loop: nothing for an empty conversation.
  EXPECT_EQ(render(t, {}, true), "<|im_start|>assistant\n");
}

// ---- Llama 2 ------------------------------------------------------------------

TEST(ChatTemplateLlama2, FoldsTheSystemPromptIntoTheFirstUserTurn) {
  ChatTemplate t = make_chat_template(kLlama2, "<s>", "</s>");
  EXPECT_EQ(t.family(), ChatFamily::kLlama2);
  EXPECT_TRUE(t.adds_bos_text());
  EXPECT_TRUE(t.supports_system_role());
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello [/INST]"
      " Hi there </s><s>[INST] Who are you? [/INST]";
  EXPECT_EQ(render(t, kChat, true), expected);
  // The template has no generation prompt: the flag changes nothing.
  EXPECT_EQ(render(t, kChat, false), expected);
}

TEST(ChatTemplateLlama2, StripsTurnsAndKeepsAnEmptySystemBlock) {
  ChatTemplate t = make_chat_template(kLlama2, "<s>", "</s>");
  EXPECT_EQ(render(t, {{"user", "  Hello \n"}, {"assistant", "\n Hi  "}, {"user", "Bye"}}, true),
            "<s>[INST] Hello [/INST] Hi </s><s>[INST] Bye [/INST]");
  // `system_message != false` holds for "": the <<SYS>> block is written empty.
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "Hello"}}, true),
            "<s>[INST] <<SYS>>\n\n<</SYS>>\n\nHello [/INST]");
  // strip() applies to the folded text as a whole: blanks around the system
  // prompt stay inside the block, the user text's trailing ones go.
  EXPECT_EQ(render(t, {{"system", " sys "}, {"user", "Hello "}}, true),
            "<s>[INST] <<SYS>>\n sys \n<</SYS>>\n\nHello [/INST]");
}

TEST(ChatTemplateLlama2, RolesMustAlternate) {
  ChatTemplate t = make_chat_template(kLlama2, "<s>", "</s>");
  Result<std::string> r = t.apply({{"user", "a"}, {"user", "b"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.message().find("alternate"), std::string::npos) << r.message();
  EXPECT_FALSE(t.apply({{"assistant", "first"}}, true).ok());
  // A system message in an assistant's place passes the template's check and
  // is then written by no branch: dropped, as transformers renders it.
  EXPECT_EQ(render(t, {{"user", "a"}, {"system", "s"}, {"user", "b"}}, true),
            "<s>[INST] a [/INST]<s>[INST] b [/INST]");
}

// ---- Llama 3.0 ---------------------------------------------------------------

TEST(ChatTemplateLlama3, Llama30HasNoDateHeaderAndTrims) {
  ChatTemplate t = make_chat_template(kLlama30, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(t.family(), ChatFamily::kLlama3);
  EXPECT_TRUE(t.adds_bos_text());
  EXPECT_EQ(t.date_string(), "");
  const std::string turns =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "You are a helpful assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>";
  EXPECT_EQ(render(t, kChat, false), turns);
  EXPECT_EQ(render(t, kChat, true), turns + "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateLlama3, TrimIsPythonStripOverUnicodeWhitespace) {
  ChatTemplate t = make_chat_template(kLlama30, "<|begin_of_text|>", "<|eot_id|>");
  // NBSP, ideographic space, line separator and U+001C are whitespace to
  // Python; the zero-width space U+200B is not.
  EXPECT_EQ(
      render(t, {{"user", "\u00a0\u3000 hi \u2028\x1c"}, {"assistant", "\u200b ok \u200b"}}, false),
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n\u200b ok \u200b<|eot_id|>");
  // Invalid UTF-8 is kept as it is, not taken for whitespace.
  EXPECT_EQ(render(t, {{"user", " \xC2 \xE3\x80"}}, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n\xC2 \xE3\x80<|eot_id|>");
}

// ---- Zephyr -----------------------------------------------------------------

TEST(ChatTemplateZephyr, EachTurnEndsWithEosAndANewline) {
  ChatTemplate t = make_chat_template(kZephyr, "<s>", "</s>");
  EXPECT_EQ(t.family(), ChatFamily::kZephyr);
  EXPECT_FALSE(t.adds_bos_text());
  EXPECT_TRUE(t.supports_system_role());
  const std::string turns =
      "<|system|>\nYou are a helpful assistant.</s>\n"
      "<|user|>\nHello</s>\n"
      "<|assistant|>\nHi there</s>\n"
      "<|user|>\nWho are you?</s>\n";
  EXPECT_EQ(render(t, kChat, false), turns);
  EXPECT_EQ(render(t, kChat, true), turns + "<|assistant|>\n");
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "x"}}, true),
            "<|system|>\n</s>\n<|user|>\nx</s>\n<|assistant|>\n");
  // The generation prompt is written inside the message loop.
  EXPECT_EQ(render(t, {}, true), "");
}

// ---- Phi-3 ------------------------------------------------------------------

TEST(ChatTemplatePhi3, MiniWritesSystemTurnsAndEosWithoutGenerationPrompt) {
  ChatTemplate t = make_chat_template(kPhi3Mini, "<s>", "<|endoftext|>");
  EXPECT_EQ(t.family(), ChatFamily::kPhi3);
  EXPECT_FALSE(t.adds_bos_text());
  const std::string turns =
      "<|system|>\nYou are a helpful assistant.<|end|>\n"
      "<|user|>\nHello<|end|>\n"
      "<|assistant|>\nHi there<|end|>\n"
      "<|user|>\nWho are you?<|end|>\n";
  EXPECT_EQ(render(t, kChat, true), turns + "<|assistant|>\n");
  EXPECT_EQ(render(t, kChat, false), turns + "<|endoftext|>");
  // This revision does not test the content: an empty system turn is written.
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "x"}}, true),
            "<|system|>\n<|end|>\n<|user|>\nx<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplatePhi3, LegacyDropsSystemAndAlwaysOpensTheAnswer) {
  ChatTemplate t = make_chat_template(kPhi3Legacy, "<s>", "<|endoftext|>");
  EXPECT_EQ(t.family(), ChatFamily::kPhi3);
  EXPECT_TRUE(t.adds_bos_text());
  EXPECT_FALSE(t.supports_system_role());
  const std::string expected =
      "<s><|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
      "<|user|>\nWho are you?<|end|>\n<|assistant|>\n";
  EXPECT_EQ(render(t, kChat, true), expected);
  EXPECT_EQ(render(t, kChat, false), expected);
}

// ---- Mistral ----------------------------------------------------------------

TEST(ChatTemplateMistral, V01SpacesAfterEos) {
  ChatTemplate t = make_chat_template(kMistralV01, "<s>", "</s>");
  EXPECT_TRUE(t.adds_bos_text());
  EXPECT_FALSE(t.supports_system_role());
  EXPECT_EQ(render(t, kChatNoSystem, true),
            "<s>[INST] Hello [/INST]Hi there</s> [INST] Who are you? [/INST]");
}

TEST(ChatTemplateMistral, V02IsTheV1Layout) {
  ChatTemplate t = make_chat_template(kMistralV02, "<s>", "</s>");
  const std::string expected = "<s>[INST] Hello [/INST]Hi there</s>[INST] Who are you? [/INST]";
  EXPECT_EQ(render(t, kChatNoSystem, true), expected);
  EXPECT_EQ(render(t, kChatNoSystem, false), expected);
  EXPECT_EQ(render(t, {{"user", "Hello"}, {"assistant", "Hi"}}, true),
            "<s>[INST] Hello [/INST]Hi</s>");
}

TEST(ChatTemplateMistral, V02RejectsSystemMessagesAndBrokenAlternation) {
  ChatTemplate t = make_chat_template(kMistralV02, "<s>", "</s>");
  Result<std::string> with_system = t.apply(kChat, true);
  ASSERT_FALSE(with_system.ok());
  EXPECT_EQ(with_system.error().code(), ErrorCode::kInvalidArgument);
  Result<std::string> two_users = t.apply({{"user", "a"}, {"user", "b"}}, true);
  ASSERT_FALSE(two_users.ok());
  EXPECT_NE(two_users.message().find("message 1 is 'user'"), std::string::npos)
      << two_users.message();
}

TEST(ChatTemplateMistral, V3PutsTheSystemPromptInTheLastUserTurn) {
  ChatTemplate t = make_chat_template(kMistralV3, "<s>", "</s>");
  EXPECT_EQ(t.family(), ChatFamily::kMistral);
  EXPECT_TRUE(t.supports_system_role());
  EXPECT_EQ(render(t, kChat, true),
            "<s>[INST] Hello[/INST] Hi there</s>"
            "[INST] You are a helpful assistant.\n\nWho are you?[/INST]");
  // The assistant text is trimmed, then given one leading space.
  EXPECT_EQ(render(t, {{"user", "Hello"}, {"assistant", "  Hi  "}, {"user", "Bye"}}, false),
            "<s>[INST] Hello[/INST] Hi</s>[INST] Bye[/INST]");
  // The system prompt only goes with a user turn that is last: after an
  // assistant turn it is not written at all.
  EXPECT_EQ(render(t, {{"system", "S"}, {"user", "Hello"}, {"assistant", "Hi"}}, false),
            "<s>[INST] Hello[/INST] Hi</s>");
  EXPECT_EQ(render(t, {{"system", ""}, {"user", "Hello"}}, true), "<s>[INST] \n\nHello[/INST]");
  EXPECT_FALSE(t.apply({{"user", "a"}, {"system", "late"}}, true).ok());
  EXPECT_FALSE(t.apply({{"user", "a"}, {"user", "b"}}, true).ok());
}

TEST(ChatTemplateMistral, V3TekkenIsTight) {
  ChatTemplate t = make_chat_template(kMistralV3Tekken, "<s>", "</s>");
  EXPECT_EQ(render(t, kChat, true),
            "<s>[INST]Hello[/INST]Hi there</s>"
            "[INST]You are a helpful assistant.\n\nWho are you?[/INST]");
  EXPECT_EQ(render(t, {{"user", "Hello"}, {"assistant", " Hi "}, {"user", "Bye"}}, true),
            "<s>[INST]Hello[/INST] Hi </s>[INST]Bye[/INST]");
}

TEST(ChatTemplateMistral, V7WritesSystemPromptsWhereTheyAre) {
  ChatTemplate t = make_chat_template(kMistralV7, "<s>", "</s>");
  EXPECT_TRUE(t.supports_system_role());
  EXPECT_EQ(render(t, kChat, true),
            "<s>[SYSTEM_PROMPT] You are a helpful assistant.[/SYSTEM_PROMPT]"
            "[INST] Hello[/INST] Hi there</s>[INST] Who are you?[/INST]");
  // No alternation check in this template.
  EXPECT_EQ(render(t, {{"user", "a"}, {"user", "b"}, {"system", "c"}}, true),
            "<s>[INST] a[/INST][INST] b[/INST][SYSTEM_PROMPT] c[/SYSTEM_PROMPT]");
}

TEST(ChatTemplateMistral, DefaultSystemPromptBuiltFromTheDateIsAWarning) {
  // The shape of Mistral-Small-3.x: a default system prompt made with today's
  // date, written in a [SYSTEM_PROMPT] block before the turns.
  const char* small3 =
      "{%- set today = strftime_now(\"%Y-%m-%d\") %}\n"
      "{%- set default_system_message = \"You are Mistral Small 3. Today is \" + today + \".\" %}\n"
      "{{- bos_token }}\n"
      "{%- if messages[0]['role'] == 'system' %}\n"
      "    {%- set system_message = messages[0]['content'] %}\n"
      "    {%- set loop_messages = messages[1:] %}\n"
      "{%- else %}\n"
      "    {%- set system_message = default_system_message %}\n"
      "    {%- set loop_messages = messages %}\n"
      "{%- endif %}\n"
      "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n"
      "{%- for message in loop_messages %}\n"
      "    {%- if message['role'] == 'user' %}\n"
      "        {{- '[INST]' + message['content'] + '[/INST]' }}\n"
      "    {%- elif message['role'] == 'assistant' %}\n"
      "        {{- message['content'] + eos_token }}\n"
      "    {%- endif %}\n"
      "{%- endfor %}\n";
  ChatTemplate t = make_chat_template(small3, "<s>", "</s>");
  EXPECT_EQ(t.family(), ChatFamily::kMistral);
  EXPECT_NE(t.warning().find("default system prompt"), std::string::npos) << t.warning();
  // With a system message of its own the prompt is exact.
  EXPECT_EQ(render(t, {{"system", "S"}, {"user", "Hello"}, {"assistant", "Hi"}}, true),
            "<s>[SYSTEM_PROMPT]S[/SYSTEM_PROMPT][INST]Hello[/INST]Hi</s>");
}

// ---- Robustness ---------------------------------------------------------------

// Every prefix of every embedded template (unterminated tags, strings cut in
// half) still gives a usable template and never crashes (ASan/UBSan runs).
TEST(ChatTemplateRobustness, TruncatedTemplatesNeverFail) {
  for (const char* full :
       {kChatML, kLlama2, kLlama30, kZephyr, kPhi3Mini, kMistralV3, kMistralV7}) {
    const std::string text = full;
    for (size_t n = 0; n <= text.size(); n += 3) {
      ChatTemplate t = make_chat_template(std::string_view(text).substr(0, n), "<s>", "</s>");
      Result<std::string> r = t.apply(kChatNoSystem, true);
      // A family's own checks may refuse the conversation; the fallback never does.
      if (t.family() == ChatFamily::kFallback) {
        EXPECT_TRUE(r.ok()) << n;
      }
    }
  }
}

TEST(ChatTemplateRobustness, BosAndEosAreTheVocabularysTexts) {
  ChatTemplate t = make_chat_template(kLlama2, "<BOS>", "<EOS>");
  EXPECT_EQ(t.bos_text(), "<BOS>");
  EXPECT_EQ(t.eos_text(), "<EOS>");
  EXPECT_EQ(render(t, {{"user", "a"}, {"assistant", "b"}}, true), "<BOS>[INST] a [/INST] b <EOS>");
}

}  // namespace
}  // namespace loom
