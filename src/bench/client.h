// The OpenAI-compatible HTTP client of the serving benchmark: HTTP/1.1 over TCP with Boost.Beast,
// one connection per request, all requests on one Asio event loop (C++20 coroutines), so hundreds
// of concurrent streams cost one thread.
//
// A streamed request is timed on the steady clock from the moment it is sent:
//   TTFT = the first SSE event whose choices carry generated text (text, delta.content or
//          delta.reasoning_content), ITL = the gaps between later such events, latency = the last
//          one. Events carrying only a role, or only usage, are not tokens. The usage event
//          (stream_options.include_usage) gives the output token count.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench/request_result.h"
#include "bench/url.h"

namespace osprey::bench {

struct HttpTarget {
  BaseUrl base;
  std::string api_key;  // sent as "Authorization: Bearer <key>" when not empty
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// A blocking GET of base.prefix + path. Throws osprey::Error when the server cannot be reached.
HttpResponse http_get(const HttpTarget& target, const std::string& path, double timeout_s = 30);

// One request of a run: the JSON body to POST and the dataset's planned lengths.
struct PlannedRequest {
  std::string body;
  int prompt_len = 0;
  int output_len = 0;
};

struct RunOptions {
  std::string endpoint = "/v1/completions";  // POSTed at base.prefix + endpoint
  std::vector<double> send_times;            // [n_requests] seconds from the start of the run
  int max_concurrency = 0;                   // requests in flight at most; 0 = no limit
  double request_timeout_s = 6 * 3600.0;     // a request still running after this fails
  // Called on the event-loop thread after each request ends (completed so far, total).
  std::function<void(size_t, size_t)> on_progress;
};

struct RunOutcome {
  std::vector<RequestResult> results;  // [n_requests], in request order
  double duration_s = 0;               // from the first send to the last request's end
};

// Sends every request at its send time (later when max_concurrency requests are in flight),
// streams the responses and times them. Failures are recorded per request, never thrown; throws
// osprey::Error only when the host name does not resolve.
RunOutcome run_requests(const HttpTarget& target, const std::vector<PlannedRequest>& requests,
                        const RunOptions& options);

}  // namespace osprey::bench
