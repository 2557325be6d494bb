#include "engine/async_engine.h"

#include <cstdio>

namespace osprey {

bool RequestStream::next(RequestOutput* out) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !queue_.empty() || drained_; });
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (out->finished) drained_ = true;
  return true;
}

bool RequestStream::try_next(RequestOutput* out) {
  std::lock_guard<std::mutex> lk(mu_);
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (out->finished) drained_ = true;
  return true;
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  notify_ = std::move(fn);
}

void RequestStream::push(RequestOutput out) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ended_ = ended_ || out.finished;
    queue_.push_back(std::move(out));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

AsyncEngine::AsyncEngine(const DeepseekModel& model, const EngineConfig& cfg,
                         TextDecoderFactory decoders,
                         std::function<void(const EngineStats&)> on_step)
    : engine_(model, cfg, std::move(decoders)), on_step_(std::move(on_step)) {
  stats_ = engine_.stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestStream> AsyncEngine::submit(std::vector<int32_t> prompt,
                                                   SamplingParams params) {
  engine_.validate(prompt, params);  // const and thread-safe: reads only the configs
  const uint64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id);
  {
    std::lock_guard<std::mutex> lk(mu_);
    submissions_.push_back({id, std::move(prompt), std::move(params)});
    streams_[id] = stream;
    ++unfinished_;
  }
  cv_.notify_all();
  return stream;
}

void AsyncEngine::abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborts_.push_back(id);
  }
  cv_.notify_all();
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void AsyncEngine::loop() {
  for (;;) {
    std::vector<Submission> subs;
    std::vector<uint64_t> aborts;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !submissions_.empty() || !aborts_.empty() || engine_.has_unfinished();
      });
      if (stop_) break;
      subs.swap(submissions_);
      aborts.swap(aborts_);
    }
    for (Submission& s : subs) {
      try {
        engine_.add_request(s.id, std::move(s.prompt), std::move(s.params));
      } catch (const Error& e) {  // validated at submit; kept so a stream never hangs
        RequestOutput o;
        o.id = s.id;
        o.finished = true;
        o.finish_reason = FinishReason::Abort;
        std::shared_ptr<RequestStream> st;
        {
          std::lock_guard<std::mutex> lk(mu_);
          st = streams_[s.id];
          streams_.erase(s.id);
        }
        --unfinished_;
        if (st) st->push(std::move(o));
      }
    }
    for (uint64_t id : aborts) engine_.abort(id);
    std::vector<RequestOutput> outs;
    const int64_t steps_before = engine_.stats().steps;
    try {
      outs = engine_.step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "osprey: engine step failed: %s\n", e.what());
      std::abort();  // the model state is unknown; a supervisor restarts the server
    }
    std::vector<std::pair<std::shared_ptr<RequestStream>, RequestOutput>> deliver;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (RequestOutput& o : outs) {
        auto it = streams_.find(o.id);
        if (it == streams_.end()) continue;
        const bool fin = o.finished;
        deliver.emplace_back(it->second, std::move(o));
        if (fin) {
          streams_.erase(it);
          --unfinished_;
        }
      }
      stats_ = engine_.stats();
    }
    for (auto& [st, o] : deliver) st->push(std::move(o));
    if (on_step_) {
      const EngineStats s = engine_.stats();
      if (s.steps > steps_before) on_step_(s);
    }
  }
}

}  // namespace osprey
