// Drives `dsinfer inspect` as a user would.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/safetensors_writer.h"
#include "model_test_util.h"

namespace dsinfer {
namespace {

using testing::ScratchDir;

struct RunResult {
  int exit_code;
  std::string output;
};

RunResult run_binary(const std::string& args) {
  const std::string cmd = std::string(DSINFER_BINARY) + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(CmdInspectTest, SummarisesValidCheckpoint) {
  ScratchDir dir;
  dir.write("config.json", testing::tiny_v3_config_json().dump());
  const ModelConfig c = testing::tiny_v3_config();
  SafetensorsWriter w;
  testing::add_expected(w, c, /*with_mtp=*/true, /*fp8=*/false);
  w.write(dir.file("model.safetensors"));

  const RunResult r = run_binary("inspect --model " + dir.path() + " --tensors 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(j["valid"].get<bool>());
  EXPECT_EQ(j["config"]["architecture"], "DeepseekV3ForCausalLM");
  EXPECT_EQ(j["config"]["topk_method"], "noaux_tc");
  EXPECT_EQ(j["num_tensors"].get<size_t>(), w.num_tensors());
  EXPECT_EQ(j["tensors"].size(), w.num_tensors());
  EXPECT_EQ(j["mtp_layers_present"], nlohmann::json::array({2}));
  int64_t params = 0;
  for (const ExpectedTensor& t : expected_tensors(c)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    params += n;
  }
  EXPECT_EQ(j["num_params"].get<int64_t>(), params);
  EXPECT_EQ(j["bytes_by_dtype"]["BF16"].get<int64_t>(), 2 * params);
}

TEST(CmdInspectTest, ReportsProblemsAndFails) {
  ScratchDir dir;
  dir.write("config.json", testing::tiny_v3_config_json().dump());
  SafetensorsWriter w;
  w.add_zeros("model.embed_tokens.weight", DType::kBF16, {32, 16});
  w.write(dir.file("model.safetensors"));
  const RunResult r = run_binary("inspect --model " + dir.path() + " 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("missing tensor model.norm.weight [16]"), std::string::npos) << r.output;

  const RunResult usage = run_binary("inspect --bogus 2>&1");
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.output.find("--bogus"), std::string::npos) << usage.output;
}

}  // namespace
}  // namespace dsinfer
