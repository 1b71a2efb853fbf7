// One generation request in flight: its engine requests (one per choice), and the path from
// engine outputs to the client: TokenTextStream → OutputEventParser → ProtocolEncoder →
// HttpExchange. Lives on the server's I/O thread; engine callbacks post back to it.
//
// Ends when every choice has ended (eos, length, stop string, error) or the client goes away
// (disconnect, or too slow to read: the exchange refuses a write); the latter cancels the
// remaining engine requests, whose KV blocks the engine then frees within a step.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/api_request.h"
#include "codec/protocol_encoder.h"
#include "dsinfer/engine_client.h"
#include "server/http_exchange.h"
#include "server/model_codec.h"
#include "server/output_inbox.h"
#include "server/server_metrics.h"

namespace dsinfer::server {

struct SessionSetup {
  EngineClient* engine = nullptr;
  const ModelCodec* codec = nullptr;
  ServerMetrics* metrics = nullptr;
  std::shared_ptr<OutputInbox> inbox;  // engine thread → I/O thread
  std::string route;  // metrics label
  std::string response_id;
  std::string model_name;
  std::vector<TokenId> prompt_ids;
  std::string echo_prompt;  // Completions echo
  ParserOptions parser;
  // Assistant text the server wrote after the prompt (forced tool calls): read by each choice's
  // parser before the model's first token, as part of the answer.
  std::string forced_output_prefix;
  std::chrono::steady_clock::time_point arrival;
  // Called once when the session ends (I/O thread), whatever the outcome.
  std::function<void()> on_done;
  // Called once when the first token arrives (the request stops counting as queued).
  std::function<void()> on_first_token;
};

class GenerationSession : public std::enable_shared_from_this<GenerationSession> {
 public:
  GenerationSession(codec::ApiRequest request, SessionSetup setup, std::shared_ptr<HttpExchange> exchange);

  // Submits the engine requests. On failure nothing was sent to the client and nothing is left
  // running; the caller answers with the returned error.
  std::optional<codec::ApiError> start();

  // Cancels whatever is still running and ends the response (server shutdown).
  void abort();

 private:
  struct Choice {
    RequestId engine_id = 0;
    bool submitted = false;
    bool engine_done = false;
    bool ended = false;
    int num_tokens = 0;
    int num_reasoning_tokens = 0;
    bool prefix_parsed = false;
    std::unique_ptr<TokenTextStream> text;
    std::unique_ptr<OutputEventParser> parser;
    std::chrono::steady_clock::time_point last_token_time;
    // With logprobs: the entries of tokens whose text has not yet shown whether it is content
    // (held back as a possible delimiter or part of a character).
    std::vector<codec::TokenLogprobs> pending_logprobs;
  };

  void on_output(int choice, const RequestOutput& output);
  void process_output(int choice, const RequestOutput& output);
  void end_choice(int choice, codec::ChoiceEnd end, const std::string& stop_string);
  void handle_events(int choice, std::vector<codec::OutputEvent>& events);
  // Hands the pending entries to the encoder when `events` carry content, or drops them when
  // the tokens' text turned out to be reasoning, a tool call or a stop string.
  void settle_logprobs(int choice, const std::vector<codec::OutputEvent>& events);
  codec::TokenLogprobs reported_logprobs(const TokenLogprob& logprob) const;
  void maybe_finish();
  // The error a request that failed in the engine answers with (engine_error_).
  codec::ApiError generation_error() const;
  void client_gone();
  void flush_stream();
  void done();

  codec::ApiRequest request_;
  SessionSetup setup_;
  std::shared_ptr<HttpExchange> exchange_;
  std::unique_ptr<codec::ProtocolEncoder> encoder_;
  std::vector<Choice> choices_;
  std::string out_;  // encoded bytes not yet written
  int num_cached_prompt_tokens_ = 0;
  bool first_token_seen_ = false;
  bool finished_ = false;
  bool error_ = false;
  Status engine_error_;  // the first engine error a choice ended with
};

}  // namespace dsinfer::server
