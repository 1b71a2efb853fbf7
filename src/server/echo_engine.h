// A scripted EngineClient: no model, deterministic answers, real engine-like behaviour
// (a step thread, a waiting queue with a cap, a KV block pool whose blocks return on finish
// and cancel). With ByteCodec it answers each request with the bytes of its prompt between
// ByteCodec::kReplyBegin and kReplyEnd (the whole prompt when those are absent), one token per
// request per step, then kEosId. Used by `dsinfer serve --engine echo` and the server's tests.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "dsinfer/engine_client.h"

namespace dsinfer::server {

struct EchoEngineOptions {
  int max_context_tokens = 4096;
  int max_running = 256;          // requests decoded per step; others wait
  int max_waiting = 100000;       // submit() beyond this → kResourceExhausted
  int step_interval_us = 1000;    // simulated step time
  int block_size_tokens = 16;
  int num_kv_blocks = 1 << 20;
  TokenId eos_id = 256;
  TokenId reply_begin_id = 257;
  TokenId reply_end_id = 258;
};

class EchoEngine : public EngineClient {
 public:
  explicit EchoEngine(EchoEngineOptions options = {});
  ~EchoEngine() override;

  Result<RequestId> submit(GenerationRequest request, OutputCallback on_output) override;
  void cancel(RequestId id) override;
  EngineStats stats() const override;
  int max_context_tokens() const override { return options_.max_context_tokens; }

  // Stops the step thread; pending requests get kCancelled outputs.
  void shutdown();

 private:
  struct Active {
    RequestId id = 0;
    std::vector<TokenId> script;  // what it will say
    size_t next = 0;
    int max_tokens = 0;
    int num_prompt_tokens = 0;
    int num_blocks = 0;
    bool cancelled = false;
    bool ignore_eos = false;
    bool logprobs = false;
    int num_logprobs = 0;
    OutputCallback on_output;
  };

  void loop();
  int blocks_for(int num_tokens) const;

  EchoEngineOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Active>> waiting_;
  std::map<RequestId, std::shared_ptr<Active>> running_;
  std::map<RequestId, std::shared_ptr<Active>> by_id_;
  RequestId next_id_ = 1;
  int num_blocks_used_ = 0;
  int64_t num_steps_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dsinfer::server
