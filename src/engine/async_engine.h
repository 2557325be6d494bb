// AsyncEngine: the engine on its own thread, for the server.
// Other threads talk to it only through submit() (a queue the engine drains before each step),
// abort() (a flag read at the next step) and each request's RequestStream (a thread-safe queue of
// outputs, with an optional notify callback so an event loop can be woken instead of blocking).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace osprey {

class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  // Blocks until an output is available; false once the final output has been taken.
  bool next(RequestOutput* out);
  // Non-blocking: true and fills *out if an output is ready.
  bool try_next(RequestOutput* out);
  // Called on the engine thread after each push (e.g. to post a wake-up to an event loop).
  void set_notify(std::function<void()> fn);

  void push(RequestOutput out);  // engine side

 private:
  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool ended_ = false;  // the final output was pushed
  bool drained_ = false;
  std::function<void()> notify_;
};

class AsyncEngine {
 public:
  // on_step, when set, runs on the engine thread after every step that ran the model.
  AsyncEngine(const DeepseekModel& model, const EngineConfig& cfg, TextDecoderFactory decoders = {},
              std::function<void(const EngineStats&)> on_step = {});
  ~AsyncEngine();

  // Validates now (throws osprey::Error with the reason, nothing queued), then queues.
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, SamplingParams params);
  void abort(uint64_t id);
  EngineStats stats() const;
  int max_model_len() const { return engine_.max_model_len(); }
  const ModelConfig& model_config() const { return engine_.model_config(); }
  size_t num_unfinished() const { return unfinished_.load(); }

 private:
  void loop();

  Engine engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Submission {
    uint64_t id;
    std::vector<int32_t> prompt;
    SamplingParams params;
  };
  std::vector<Submission> submissions_;
  std::vector<uint64_t> aborts_;
  std::map<uint64_t, std::shared_ptr<RequestStream>> streams_;
  EngineStats stats_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> unfinished_{0};
  std::function<void(const EngineStats&)> on_step_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace osprey
