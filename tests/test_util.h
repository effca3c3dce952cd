// Helpers shared by the test suites: fixture lookup and temporary files.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/synth.h"

namespace loom::test {

/// What a plain Session on the CPU generates greedily (temperature 0) for a
/// chat through the model's template: the reference for servers and clients.
/// Bytes that do not form UTF-8 come out as U+FFFD (as servers send them).
std::string greedy_chat(const Model& m, const std::vector<ChatMessage>& messages,
                        int64_t max_tokens);

/// Directory of ../shared/fixtures (or $LOOM_FIXTURES), or nullopt when absent.
std::optional<std::string> fixtures_dir();

/// Full path of a fixture file, or nullopt when the fixtures or the file are absent.
std::optional<std::string> fixture_path(const std::string& relative);

/// A fresh empty directory `name` private to the running test (under the build
/// tree), emptied and created on call.
std::string temp_dir(const std::string& name);

/// A model `loom synth` writes from `spec` into temp_dir(name), loaded; null
/// (after a test failure naming the error) when either step fails.
std::unique_ptr<Model> synth_model(const SynthSpec& spec, const std::string& name);

std::vector<uint8_t> read_file(const std::string& path);
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);

/// A forward pass's notes after a placement on the GPU: none, or for a model
/// whose attention only the CPU runs (Model::host_attention_reason) the one
/// that says so, the placement still using the GPU.
void expect_gpu_pass_notes(const Model& m, const std::vector<std::string>& notes, bool uses_gpu);

}  // namespace loom::test

/// Skips the current test, saying why, when a fixture file is not there.
#define LOOM_FIXTURE_OR_SKIP(var, relative)                                           \
  std::string var;                                                                    \
  do {                                                                                \
    auto loom_fx_ = ::loom::test::fixture_path(relative);                             \
    if (!loom_fx_)                                                                    \
      GTEST_SKIP() << "fixture " << (relative)                                        \
                   << " not found (set LOOM_FIXTURES or provide ../shared/fixtures)"; \
    var = *loom_fx_;                                                                  \
  } while (0)
