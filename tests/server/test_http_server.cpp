// The HTTP server's connection handling (server/http.h) with raw sockets: a client that goes away
// while a streamed response is backed up behind it (it never reads, so a write is in flight) is
// closed once, its on_close runs once, and the server keeps serving others.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "server/http.h"

namespace osprey::server {
namespace {

using namespace std::chrono_literals;

// More than the loopback socket buffers of both ends hold (a few MiB each), so the server's writes
// to a client that never reads stay blocked: 64 chunks of 256 KiB = 16 MiB.
constexpr int kStallChunks = 64;
constexpr size_t kStallChunkBytes = size_t(256) << 10;
// Time for the server to fill the socket buffers before the client goes away.
constexpr auto kFillTime = 300ms;
constexpr auto kCloseDeadline = 10s;

// A server on an ephemeral port, run by two I/O threads (as `osprey serve`): /stall streams
// kStallChunks chunks (and never ends) and counts on_close calls, /stall-ended also ends the
// stream; any other path answers "pong".
class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions opts;
    opts.port = 0;
    opts.io_threads = 2;
    server_ = std::make_unique<HttpServer>(
        opts, [this](const HttpRequest& req, std::shared_ptr<Responder> res) {
          if (req.path != "/stall" && req.path != "/stall-ended")
            return res->respond(200, "text/plain", "pong");
          res->start_stream(200, "text/plain");
          res->on_close([this] { ++closes_; });
          // No end(): the stream stays open, as a generation still running, so the server
          // watches for the client going away.
          for (int i = 0; i < kStallChunks; ++i) res->write(std::string(kStallChunkBytes, 'x'));
          if (req.path == "/stall-ended") res->end();  // all queued: no close watch, no on_close
        });
    runner_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    server_->stop();
    runner_.join();
    server_.reset();
  }

  int connect_client() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  }

  static void send_all(int fd, const std::string& s) {
    EXPECT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size()));
  }

  // A plain request on a fresh connection; returns the whole answer (the server closes).
  std::string ping() const {
    const int fd = connect_client();
    send_all(fd, "GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
    ::close(fd);
    return got;
  }

  bool wait_closes(int n) const {
    const auto deadline = std::chrono::steady_clock::now() + kCloseDeadline;
    while (closes_ < n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    return closes_ == n;
  }

  std::unique_ptr<HttpServer> server_;
  std::thread runner_;
  std::atomic<int> closes_{0};
};

// The client half-closes (FIN) while never reading: the server sees EOF through its close watch
// while its write is still blocked; the aborted write must not touch the dropped write queue.
TEST_F(HttpServerTest, ClientHalfClosesWhileAWriteIsBlocked) {
  for (int round = 1; round <= 3; ++round) {
    const int fd = connect_client();
    send_all(fd, "GET /stall HTTP/1.1\r\nHost: t\r\n\r\n");
    std::this_thread::sleep_for(kFillTime);
    ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
    EXPECT_TRUE(wait_closes(round))
        << "round " << round << ": on_close ran " << closes_ << " times";
    ::close(fd);
    const std::string answer = ping();
    EXPECT_TRUE(answer.starts_with("HTTP/1.1 200 OK")) << answer;
    EXPECT_TRUE(answer.ends_with("\r\n\r\npong")) << answer;
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(closes_, 3);  // once per connection, never twice
}

// The client resets the connection (close with unread data and SO_LINGER 0): the blocked write
// fails and the close watch fires at about the same time, in either order.
TEST_F(HttpServerTest, ClientResetsWhileAWriteIsBlocked) {
  for (int round = 1; round <= 3; ++round) {
    const int fd = connect_client();
    send_all(fd, "GET /stall HTTP/1.1\r\nHost: t\r\n\r\n");
    std::this_thread::sleep_for(kFillTime);
    const linger reset{1, 0};
    ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
    ::close(fd);
    EXPECT_TRUE(wait_closes(round))
        << "round " << round << ": on_close ran " << closes_ << " times";
    const std::string answer = ping();
    EXPECT_TRUE(answer.ends_with("\r\n\r\npong")) << answer;
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(closes_, 3);
}

// The whole stream is queued (ended) when the client resets: no close watch runs, so the failed
// write alone closes the connection, from its own completion.
TEST_F(HttpServerTest, ClientResetsAfterTheStreamEndedWhileAWriteIsBlocked) {
  for (int round = 1; round <= 3; ++round) {
    const int fd = connect_client();
    send_all(fd, "GET /stall-ended HTTP/1.1\r\nHost: t\r\n\r\n");
    std::this_thread::sleep_for(kFillTime);
    const linger reset{1, 0};
    ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
    ::close(fd);
    const std::string answer = ping();
    EXPECT_TRUE(answer.ends_with("\r\n\r\npong")) << answer;
  }
  EXPECT_EQ(closes_, 0);  // the response had ended: nothing to abort
}

}  // namespace
}  // namespace osprey::server
