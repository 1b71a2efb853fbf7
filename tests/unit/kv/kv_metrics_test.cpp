#include "kv/kv_metrics.h"

#include <gtest/gtest.h>

namespace dsinfer::kv {
namespace {

TEST(KvMetrics, FormatsTiersRatesAndStore) {
  KvCacheMetrics m;
  m.num_prompt_tokens = 1000;
  m.num_device_hit_tokens = 500;
  m.num_host_hit_tokens = 100;
  m.num_store_hit_tokens = 250;
  std::string text = format_kv_metrics(m);
  EXPECT_NE(text.find("dsinfer_kv_prompt_tokens_total{tier=\"store\"} 250\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsinfer_kv_prompt_tokens_total{tier=\"computed\"} 150\n"), std::string::npos);
  EXPECT_NE(text.find("dsinfer_kv_hit_rate{tier=\"device\"} 0.5\n"), std::string::npos);
  EXPECT_NE(text.find("dsinfer_kv_hit_rate{tier=\"all\"} 0.84999999999999998\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE dsinfer_kv_hit_rate gauge\n"), std::string::npos);
  EXPECT_EQ(text.find("store_bytes"), std::string::npos);  // no store configured

  m.has_store = true;
  m.store.bytes_read = 123;
  m.store.store_bytes = 4096;
  m.store.num_removed_corrupt = 2;
  text = format_kv_metrics(m);
  EXPECT_NE(text.find("dsinfer_kv_store_io_bytes_total{direction=\"read\"} 123\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsinfer_kv_store_bytes 4096\n"), std::string::npos);
  EXPECT_NE(text.find("dsinfer_kv_store_removed_total{reason=\"corrupt\"} 2\n"), std::string::npos);
}

TEST(KvMetrics, RatesAreZeroBeforeTheFirstRequest) {
  std::string text = format_kv_metrics(KvCacheMetrics{});
  EXPECT_NE(text.find("dsinfer_kv_hit_rate{tier=\"all\"} 0\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace dsinfer::kv
