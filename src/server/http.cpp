#include "server/http.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <iterator>
#include <mutex>
#include <optional>

#include "core/error.h"

namespace osprey::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {
const char* reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "";
  }
}
}  // namespace

// What the connections share with their server: the shutdown flag, the live connections (to
// close the idle ones at shutdown) and the access log switch.
struct ServerShared {
  std::atomic<bool> closing{false};
  bool log_requests = false;
  std::mutex mu;
  std::vector<std::weak_ptr<Connection>> connections;  // pruned as they expire
  std::atomic<size_t> live{0};
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket s, const Handler& h, size_t max_body, std::shared_ptr<ServerShared> sh)
      : socket_(std::move(s)),
        strand_(net::make_strand(socket_.get_executor())),
        handler_(h),
        max_body_(max_body),
        shared_(std::move(sh)) {
    ++shared_->live;
    beast::error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    if (!ec) peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Connection() { --shared_->live; }

  // Shutdown (on the strand): an idle connection closes now; a busy one after its response.
  void close_if_idle() {
    keep_alive_ = false;
    if (!in_request_) close();
  }

  void start() {
    net::dispatch(strand_, [self = shared_from_this()] { self->read(); });
  }

  // All of the below run on the strand.
  void read() {
    parser_.emplace();
    parser_->header_limit(64 * 1024);
    parser_->body_limit(max_body_);
    http::async_read(
        socket_, buffer_, *parser_,
        net::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t) {
          self->on_read(ec);
        }));
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      begin_request("?", "?");
      keep_alive_ = false;
      linger_ = true;  // the client may still be sending the body: read it away before closing
      send_full(413, "application/json",
                "{\"error\":{\"message\":\"request body larger than " + std::to_string(max_body_) +
                    " bytes\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}");
      return;
    }
    if (ec) return close();  // EOF or a malformed request: nothing to answer
    auto& req = parser_->get();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string target(req.target());
    r.path = target.substr(0, target.find('?'));
    r.body = std::move(req.body());
    r.authorization = std::string(req[http::field::authorization]);
    r.content_type = std::string(req[http::field::content_type]);
    keep_alive_ = req.keep_alive() && !shared_->closing;
    begin_request(r.method, r.path);
    responded_ = false;
    streaming_ = false;
    close_cb_ = nullptr;
    auto responder = std::make_shared<Responder>(shared_from_this());
    try {
      handler_(r, responder);
    } catch (const std::exception& e) {
      send_full(500, "application/json",
                std::string("{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\","
                            "\"param\":null,\"code\":null}}"));
    }
    watch_for_close();
  }

  void send_full(int status, const std::string& type, std::string body) {
    if (responded_ || dead_) return;
    responded_ = true;
    status_ = status;
    if (shared_->closing) keep_alive_ = false;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
    head += "Content-Type: " + type + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    enqueue(head + body);
    finished_ = true;
    maybe_next();
  }

  void send_stream_head(int status, const std::string& type) {
    if (responded_ || dead_) return;
    responded_ = true;
    streaming_ = true;
    status_ = status;
    if (shared_->closing) keep_alive_ = false;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
    head +=
        "Content-Type: " + type + "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    enqueue(std::move(head));
  }

  void send_chunk(std::string data) {
    if (!streaming_ || finished_ || dead_ || data.empty()) return;
    char len[32];
    std::snprintf(len, sizeof len, "%zx\r\n", data.size());
    enqueue(std::string(len) + data + "\r\n");
  }

  void send_end() {
    if (!streaming_ || finished_ || dead_) return;
    enqueue("0\r\n\r\n");
    finished_ = true;
    maybe_next();
  }

  void set_close_cb(std::function<void()> fn) {
    if (dead_) {
      if (fn) fn();
      return;
    }
    close_cb_ = std::move(fn);
  }

  void add_note(std::string note) {
    if (!note_.empty()) note_ += ' ';
    note_ += note;
  }

  net::strand<net::any_io_executor>& strand() { return strand_; }
  bool dead() const { return dead_; }

 private:
  void begin_request(std::string method, std::string path) {
    in_request_ = true;
    method_ = std::move(method);
    path_ = std::move(path);
    note_.clear();
    status_ = 0;
    t0_ = std::chrono::steady_clock::now();
  }

  // The request is over (response written, or the client left): its access line.
  void end_request(const char* how) {
    if (!in_request_) return;
    in_request_ = false;
    if (!shared_->log_requests) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "osprey: %s \"%s %s\" %d %.3f s%s%s%s\n", peer_.c_str(), method_.c_str(),
                 path_.c_str(), status_, s, how, note_.empty() ? "" : " ", note_.c_str());
  }

  void enqueue(std::string bytes) {
    queue_.push_back(std::move(bytes));
    if (!writing_) write_next();
  }

  void write_next() {
    if (queue_.empty() || dead_) {
      writing_ = false;
      maybe_next();
      return;
    }
    writing_ = true;
    net::async_write(
        socket_, net::buffer(queue_.front()),
        net::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t) {
          // The write is over: pop its bytes (close() keeps them while the write is in flight)
          // before anything else, so a close() from here sees no write in flight.
          self->writing_ = false;
          self->queue_.pop_front();
          if (ec) return self->close();
          self->write_next();
        }));
  }

  // After a response is fully written: the next request, or close.
  void maybe_next() {
    if (!finished_ || writing_ || !queue_.empty() || dead_) return;
    finished_ = false;
    end_request("");
    if (keep_alive_ && !shared_->closing) {
      socket_.cancel();  // stop the close watch; the read below takes over the socket
      read_pending_ = true;
      net::post(strand_, [self = shared_from_this()] {
        self->read_pending_ = false;
        self->read();
      });
    } else {
      beast::error_code ec;
      socket_.shutdown(tcp::socket::shutdown_send, ec);
      if (linger_) return discard_until_eof();
      close();
    }
  }

  // A lingering close: closing with unread input makes the kernel reset the connection, and the
  // client could lose the response it has not read yet. Read and drop input until the client
  // closes, for at most a few seconds.
  void discard_until_eof() {
    if (!linger_timer_) {
      linger_timer_.emplace(strand_);
      linger_timer_->expires_after(std::chrono::seconds(3));
      linger_timer_->async_wait([self = shared_from_this()](beast::error_code) { self->close(); });
    }
    socket_.async_read_some(
        net::buffer(discard_),
        net::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) {
            if (self->linger_timer_) self->linger_timer_->cancel();
            return self->close();
          }
          self->discard_until_eof();
        }));
  }

  // While a response is pending, notice a client that hangs up. Readiness alone can be spurious,
  // so a non-blocking peek decides: 0 bytes is EOF (close), EAGAIN is a false alarm (wait again),
  // data is a pipelined request (left for the next read).
  void watch_for_close() {
    if (dead_ || finished_ || read_pending_) return;
    socket_.async_wait(
        tcp::socket::wait_read,
        net::bind_executor(strand_, [self = shared_from_this()](beast::error_code ec) {
          if (ec == net::error::operation_aborted) return;
          if (self->read_pending_ || self->dead_ || self->finished_) return;
          if (ec) return self->close();
          char c;
          const ssize_t n = ::recv(self->socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return self->close();
          if (n < 0) self->watch_for_close();
        }));
  }

  void close() {
    if (dead_) return;
    dead_ = true;
    end_request(" (connection closed before the response ended)");
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    // Drop the unsent bytes, but not the ones an async_write still in flight points to: its
    // completion (operation_aborted, or success if it had finished) still runs and pops that
    // front entry. Clearing it too made that pop_front run on an empty deque, destroying the
    // already-destroyed string a second time (the double free of the stalled-client test).
    if (writing_)
      queue_.erase(std::next(queue_.begin()), queue_.end());
    else
      queue_.clear();
    if (close_cb_ && !finished_) {
      auto cb = std::move(close_cb_);
      close_cb_ = nullptr;
      cb();
    }
    close_cb_ = nullptr;
  }

  tcp::socket socket_;
  net::strand<net::any_io_executor> strand_;
  const Handler& handler_;
  size_t max_body_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> queue_;
  bool writing_ = false, keep_alive_ = true, responded_ = false, streaming_ = false;
  bool finished_ = false, dead_ = false, read_pending_ = false, linger_ = false;
  std::optional<net::steady_timer> linger_timer_;
  std::array<char, 4096> discard_;
  std::function<void()> close_cb_;
  std::shared_ptr<ServerShared> shared_;
  bool in_request_ = false;  // from a parsed request until its response is written
  std::string peer_, method_, path_, note_;
  int status_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

void Responder::respond(int status, const std::string& content_type, std::string body) {
  net::dispatch(conn_->strand(), [c = conn_, status, content_type, b = std::move(body)]() mutable {
    c->send_full(status, content_type, std::move(b));
  });
}
void Responder::start_stream(int status, const std::string& content_type) {
  net::dispatch(conn_->strand(),
                [c = conn_, status, content_type] { c->send_stream_head(status, content_type); });
}
void Responder::write(std::string chunk) {
  net::dispatch(conn_->strand(),
                [c = conn_, d = std::move(chunk)]() mutable { c->send_chunk(std::move(d)); });
}
void Responder::end() {
  net::dispatch(conn_->strand(), [c = conn_] { c->send_end(); });
}
void Responder::on_close(std::function<void()> fn) {
  net::dispatch(conn_->strand(),
                [c = conn_, f = std::move(fn)]() mutable { c->set_close_cb(std::move(f)); });
}
void Responder::post(std::function<void()> fn) {
  net::post(conn_->strand(), std::move(fn));
}
bool Responder::closed() const {
  return conn_->dead();
}
void Responder::annotate(std::string note) {
  net::dispatch(conn_->strand(),
                [c = conn_, n = std::move(note)]() mutable { c->add_note(std::move(n)); });
}

HttpServer::HttpServer(const HttpServerOptions& opts, Handler handler)
    : opts_(opts),
      handler_(std::move(handler)),
      shared_(std::make_shared<ServerShared>()),
      acceptor_(net::make_strand(io_)) {  // accepts and the shutdown's close, serialised
  shared_->log_requests = opts.log_requests;
  beast::error_code ec;
  const auto addr = net::ip::make_address(opts.host, ec);
  if (ec) fail("--host '", opts.host, "' is not an IP address");
  tcp::endpoint ep(addr, uint16_t(opts.port));
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on ", opts.host, ":", opts.port, ": ", ec.message());
  port_ = acceptor_.local_endpoint().port();
  accept();
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket s) {
    if (ec) {
      if (ec == net::error::operation_aborted) return;
    } else {
      s.set_option(tcp::no_delay(true), ec);
      auto c = std::make_shared<Connection>(std::move(s), handler_, opts_.max_body_bytes, shared_);
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        auto& v = shared_->connections;
        v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }),
                v.end());
        v.push_back(c);
      }
      c->start();
    }
    if (acceptor_.is_open()) accept();
  });
}

void HttpServer::run() {
  for (int i = 1; i < opts_.io_threads; ++i) threads_.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void HttpServer::stop_accepting() {
  std::promise<void> closed;
  net::post(acceptor_.get_executor(), [this, &closed] {
    beast::error_code ec;
    acceptor_.close(ec);
    closed.set_value();
  });
  closed.get_future().wait();
}

size_t HttpServer::close_connections(std::chrono::milliseconds grace) {
  shared_->closing = true;
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (const auto& w : shared_->connections)
      if (auto c = w.lock()) open.push_back(c);
  }
  for (auto& c : open) net::dispatch(c->strand(), [c] { c->close_if_idle(); });
  open.clear();  // the connections' own operations keep them alive while they are busy
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (shared_->live > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return shared_->live;
}

void HttpServer::stop() {
  net::post(acceptor_.get_executor(), [this] {
    beast::error_code ec;
    acceptor_.close(ec);
  });
  io_.stop();
}

}  // namespace osprey::server
