// GenerationSession: engine outputs → text → events → protocol bytes.
#include "server/generation_session.h"

#include "core/logging.h"
#include "tokenizer/utf8.h"

namespace dsinfer::server {

using codec::ChoiceEnd;
using codec::OutputEvent;
using codec::OutputEventKind;

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GenerationSession::GenerationSession(codec::ApiRequest request, SessionSetup setup, std::shared_ptr<HttpExchange> exchange)
    : request_(std::move(request)), setup_(std::move(setup)), exchange_(std::move(exchange)) {
  choices_.resize(static_cast<size_t>(std::max(1, request_.n)));
  for (auto& c : choices_) {
    c.text = setup_.codec->make_text_stream();
    c.parser = setup_.codec->make_parser(setup_.parser);
  }
}

std::optional<codec::ApiError> GenerationSession::start() {
  auto self = shared_from_this();
  for (size_t i = 0; i < choices_.size(); ++i) {
    GenerationRequest engine_request;
    engine_request.prompt_ids = setup_.prompt_ids;
    engine_request.sampling = request_.sampling;
    engine_request.traffic_class = request_.traffic_class;
    // n choices from one seed must still differ.
    if (engine_request.sampling.seed) *engine_request.sampling.seed += i;
    int choice = static_cast<int>(i);
    auto exchange = exchange_;
    auto inbox = setup_.inbox;
    auto result = setup_.engine->submit(std::move(engine_request), [self, choice, exchange, inbox](const RequestOutput& output) {
      // Engine thread: copy and hop to the I/O thread; never block here.
      inbox->push([self, choice, output] { self->on_output(choice, output); }, *exchange);
    });
    if (!result.ok()) {
      for (size_t j = 0; j < i; ++j) setup_.engine->cancel(choices_[j].engine_id);
      for (size_t j = 0; j < i; ++j) choices_[j].ended = true;
      finished_ = true;
      const Status& s = result.status();
      codec::ApiError error;
      error.message = s.message();
      switch (s.code()) {
        case StatusCode::kResourceExhausted: error.http_status = 429; error.code = "queue_full"; break;
        case StatusCode::kUnavailable: error.http_status = 503; error.code = "unavailable"; break;
        case StatusCode::kOutOfRange: error.http_status = 400; error.code = "context_length_exceeded"; break;
        case StatusCode::kInvalidArgument: error.http_status = 400; error.code = "invalid_value"; break;
        default: error.http_status = 500; error.code = "internal_error"; break;
      }
      return error;
    }
    choices_[i].engine_id = result.value();
    choices_[i].submitted = true;
  }
  codec::EncoderOptions options;
  options.response_id = setup_.response_id;
  options.model = setup_.model_name;
  options.created_s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  options.stream = request_.stream;
  options.include_usage = request_.include_usage;
  options.num_choices = static_cast<int>(choices_.size());
  options.num_prompt_tokens = static_cast<int>(setup_.prompt_ids.size());
  options.echo_prompt = setup_.echo_prompt;
  options.logprobs = request_.sampling.wants_logprobs();
  encoder_ = codec::make_protocol_encoder(request_.protocol, options);
  exchange_->set_on_close([self] { self->client_gone(); });
  if (request_.stream) {
    exchange_->start_stream(200, "text/event-stream; charset=utf-8");
    encoder_->begin(out_);
    flush_stream();
  } else {
    encoder_->begin(out_);
  }
  return std::nullopt;
}

void GenerationSession::on_output(int index, const RequestOutput& output) {
  try {
    process_output(index, output);
  } catch (const std::exception& e) {
    // A decoding or parsing failure ends this request, never the server.
    DS_LOG_ERROR("request " << setup_.response_id << ": " << e.what());
    error_ = true;
    for (size_t i = 0; i < choices_.size(); ++i) {
      if (choices_[i].submitted && !choices_[i].engine_done) setup_.engine->cancel(choices_[i].engine_id);
      if (!choices_[i].ended) end_choice(static_cast<int>(i), ChoiceEnd::kError, "");
    }
    if (request_.stream) flush_stream();
    maybe_finish();
  }
}

void GenerationSession::process_output(int index, const RequestOutput& output) {
  Choice& c = choices_.at(static_cast<size_t>(index));
  if (output.finished()) c.engine_done = true;
  if (finished_ || c.ended) return;
  auto now = std::chrono::steady_clock::now();
  num_cached_prompt_tokens_ = std::max(num_cached_prompt_tokens_, output.prompt_cache.num_cached_tokens());
  if (!output.new_token_ids.empty()) {
    if (!first_token_seen_) {
      first_token_seen_ = true;
      setup_.metrics->observe_time_to_first_token(seconds_between(setup_.arrival, now));
      if (setup_.on_first_token) setup_.on_first_token();
    } else if (c.num_tokens > 0) {
      double per_token = seconds_between(c.last_token_time, now) / static_cast<double>(output.new_token_ids.size());
      for (size_t i = 0; i < output.new_token_ids.size(); ++i) setup_.metrics->observe_inter_token_latency(per_token);
    }
    c.last_token_time = now;
  }
  std::vector<OutputEvent> events;
  if (!c.prefix_parsed && !c.ended) {
    c.prefix_parsed = true;
    if (!setup_.forced_output_prefix.empty()) {
      c.parser->push(setup_.forced_output_prefix, events);
      handle_events(index, events);
      events.clear();
    }
  }
  for (size_t i = 0; i < output.new_token_ids.size(); ++i) {
    if (c.ended) break;
    ++c.num_tokens;
    setup_.metrics->add_generated_tokens(1);
    std::string text = c.text->push(output.new_token_ids[i]);
    // The end-of-turn token that finished the request is not part of the answer.
    const bool ends_turn = output.finish_reason == FinishReason::kStop && i + 1 == output.new_token_ids.size();
    if (i < output.logprobs.size() && !(ends_turn && text.empty()))
      c.pending_logprobs.push_back(reported_logprobs(output.logprobs[i]));
    if (text.empty()) continue;
    events.clear();
    c.parser->push(text, events);
    bool reasoning = !events.empty();
    for (const auto& e : events) reasoning = reasoning && e.kind == OutputEventKind::kReasoning;
    if (reasoning) ++c.num_reasoning_tokens;
    handle_events(index, events);
  }
  if (!c.ended && output.finished()) {
    events.clear();
    std::string tail = c.text->finish();
    if (!tail.empty()) c.parser->push(tail, events);
    c.parser->finish(events);
    handle_events(index, events);
    if (!c.ended) {
      switch (output.finish_reason) {
        case FinishReason::kStop: end_choice(index, ChoiceEnd::kEndOfTurn, ""); break;
        case FinishReason::kLength: end_choice(index, ChoiceEnd::kLength, ""); break;
        case FinishReason::kCancelled: end_choice(index, ChoiceEnd::kCancelled, ""); break;
        case FinishReason::kError:
        case FinishReason::kNone:
          DS_LOG_WARN("request " << setup_.response_id << ": engine error: " << output.error.message());
          error_ = true;
          if (engine_error_.ok()) engine_error_ = output.error;
          end_choice(index, ChoiceEnd::kError, "");
          break;
      }
    }
  }
  if (request_.stream) flush_stream();
  maybe_finish();
}

void GenerationSession::settle_logprobs(int index, const std::vector<OutputEvent>& events) {
  Choice& c = choices_[static_cast<size_t>(index)];
  if (c.pending_logprobs.empty()) return;
  for (const OutputEvent& e : events) {
    if (e.kind == OutputEventKind::kContent && !e.text.empty()) {
      encoder_->on_logprobs(index, std::move(c.pending_logprobs));
      c.pending_logprobs.clear();
      return;
    }
  }
  // Reasoning, a tool call, a stop string, or markup the parser consumed (nothing held, no
  // event): not content. Only text still held may yet turn out to be.
  if (!events.empty() || !c.parser->holds_text()) c.pending_logprobs.clear();
}

codec::TokenLogprobs GenerationSession::reported_logprobs(const TokenLogprob& logprob) const {
  auto token = [&](TokenId id, float value) {
    codec::LogprobToken t;
    t.bytes = setup_.codec->token_bytes(id);
    t.text = tok::utf8_lossy(t.bytes);
    t.logprob = value;
    return t;
  };
  codec::TokenLogprobs out;
  out.chosen = token(logprob.token_id, logprob.logprob);
  for (const auto& [id, value] : logprob.top) out.top.push_back(token(id, value));
  return out;
}

void GenerationSession::handle_events(int index, std::vector<OutputEvent>& events) {
  settle_logprobs(index, events);
  for (const auto& e : events) {
    if (choices_[static_cast<size_t>(index)].ended) return;
    if (e.kind == OutputEventKind::kStop) {
      // The stop string is not part of the answer; the engine request has no more to give.
      Choice& c = choices_[static_cast<size_t>(index)];
      if (!c.engine_done) setup_.engine->cancel(c.engine_id);
      end_choice(index, ChoiceEnd::kStopString, e.text);
      return;
    }
    encoder_->on_event(index, e, out_);
  }
}

void GenerationSession::end_choice(int index, ChoiceEnd end, const std::string& stop_string) {
  Choice& c = choices_.at(static_cast<size_t>(index));
  if (c.ended) return;
  c.ended = true;
  encoder_->end_choice(index, end, stop_string, out_);
}

void GenerationSession::maybe_finish() {
  if (finished_) return;
  for (const auto& c : choices_) {
    if (!c.ended) return;
  }
  finished_ = true;
  codec::UsageCounts usage;
  usage.prompt_tokens = static_cast<int>(setup_.prompt_ids.size());
  usage.cached_prompt_tokens = num_cached_prompt_tokens_;
  for (const auto& c : choices_) {
    usage.completion_tokens += c.num_tokens;
    usage.reasoning_tokens += c.num_reasoning_tokens;
  }
  setup_.metrics->add_cached_prompt_tokens(num_cached_prompt_tokens_);
  setup_.metrics->observe_request_latency(seconds_between(setup_.arrival, std::chrono::steady_clock::now()));
  int status = 200;
  if (request_.stream) {
    if (error_) encoder_->stream_error(generation_error(), out_);
    encoder_->end(usage, out_);
    flush_stream();
    exchange_->end_stream();
  } else if (error_) {
    const codec::ApiError error = generation_error();
    status = error.http_status;
    exchange_->respond(status, "application/json", codec::error_body(request_.protocol, error));
  } else {
    out_.clear();
    encoder_->end(usage, out_);
    exchange_->respond(200, "application/json", std::move(out_));
  }
  setup_.metrics->count_request(setup_.route, status);
  done();
}

codec::ApiError GenerationSession::generation_error() const {
  // Out of device memory for a step, or an engine that has failed, is the server's state, not
  // the request's fault: 503, which clients retry (elsewhere, for a failed engine).
  switch (engine_error_.code()) {
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return {503, "engine_unavailable", "", engine_error_.message()};
    // The engine refused what the server let through (a check only the engine can make).
    case StatusCode::kInvalidArgument: return {400, "invalid_value", "", engine_error_.message()};
    case StatusCode::kOk: return {500, "internal_error", "", "the engine failed while generating"};
    default: return {500, "internal_error", "", engine_error_.message()};
  }
}

void GenerationSession::flush_stream() {
  if (out_.empty() || (finished_ && exchange_->closed())) {
    out_.clear();
    return;
  }
  std::string data = std::move(out_);
  out_.clear();
  if (!exchange_->write(std::move(data))) client_gone();
}

void GenerationSession::client_gone() {
  if (finished_) return;
  finished_ = true;
  for (auto& c : choices_) {
    if (c.submitted && !c.engine_done) setup_.engine->cancel(c.engine_id);
    c.ended = true;
  }
  setup_.metrics->count_cancelled();
  // 499: nginx's "client closed request"; it never reaches the client, only the metrics.
  setup_.metrics->count_request(setup_.route, 499);
  done();
}

void GenerationSession::abort() {
  if (finished_) return;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (c.submitted && !c.engine_done) setup_.engine->cancel(c.engine_id);
    end_choice(static_cast<int>(i), ChoiceEnd::kCancelled, "");
  }
  if (request_.stream) flush_stream();
  maybe_finish();
}

void GenerationSession::done() {
  if (auto fn = std::move(setup_.on_done)) {
    setup_.on_done = nullptr;
    fn();
  }
}

}  // namespace dsinfer::server
