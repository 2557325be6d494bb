// A small event-driven HTTP/1.1 server on Boost.Asio/Beast: no thread per client.
//   - A fixed pool of I/O threads runs every connection; each connection is serialised on a strand.
//   - Request bodies over max_body_bytes are refused (413) before they are read or parsed.
//   - A handler answers once (respond) or opens a stream (chunked transfer, e.g. server-sent
//     events) that any thread may write to; writes are queued per connection, so a slow or stalled
//     client only delays itself.
//   - A client that goes away (EOF while we wait, or a failed write) triggers on_close, once.
//   - Shutdown: stop_accepting() closes the listening socket; close_connections() answers every
//     later request with "Connection: close", closes idle keep-alive connections and waits for the
//     busy ones to finish writing.
//   - With log_requests, one access line per request on stderr: peer, method, path, status,
//     seconds, and what the handler added with annotate() (e.g. the request id and token counts).
#pragma once

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without including it

#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace osprey::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string body;
  std::string authorization;
  std::string content_type;
};

class Connection;

// What a handler answers through. Safe to use from any thread; calls after the first response or
// after the client went away are ignored.
class Responder {
 public:
  explicit Responder(std::shared_ptr<Connection> c) : conn_(std::move(c)) {}
  void respond(int status, const std::string& content_type, std::string body);
  // Sends the header of a chunked response; then write() chunks and end().
  void start_stream(int status, const std::string& content_type);
  void write(std::string chunk);
  void end();
  // Runs fn (on the connection's strand) if the client disconnects before the response ended.
  void on_close(std::function<void()> fn);
  // Runs fn on the connection's strand (for work that must be ordered with the writes).
  void post(std::function<void()> fn);
  bool closed() const;
  // Text appended to this request's access line (log_requests).
  void annotate(std::string note);

 private:
  std::shared_ptr<Connection> conn_;
};

using Handler = std::function<void(const HttpRequest&, std::shared_ptr<Responder>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  int io_threads = 2;
  size_t max_body_bytes = size_t(16) << 20;
  bool log_requests = false;
};

struct ServerShared;  // what the connections share with the server (http.cpp)

class HttpServer {
 public:
  HttpServer(const HttpServerOptions& opts, Handler handler);
  ~HttpServer();
  int port() const { return port_; }  // the bound port (useful with port 0)
  void run();                         // serves until stop() (blocks)
  void stop();
  // Shutdown, in this order (any thread): no new connections; then close the idle ones and
  // wait up to `grace` for the others to finish their responses. Returns the connections still
  // open after the wait.
  void stop_accepting();
  size_t close_connections(std::chrono::milliseconds grace);

 private:
  void accept();

  HttpServerOptions opts_;
  Handler handler_;
  std::shared_ptr<ServerShared> shared_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  int port_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace osprey::server
