#include "dist/tcp_comm.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace osprey::dist {

namespace {

constexpr uint32_t kMagic = 0x4f535052;  // "OSPR": a frame from another osprey rank
// Frame kinds (the collective a frame belongs to).
enum : uint32_t { kHello = 1, kAllReduce, kAllGather, kAllToAllv, kBroadcast, kBarrier, kAbort };
// Rank 0's wait is the timeout; the others wait this much longer for rank 0's reply, so that a
// relayed failure (naming the rank that failed) reaches them before their own deadline.
constexpr double kReplyGraceFactor = 1.5;
constexpr double kReplyGraceS = 2.0;

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}
Clock::time_point after(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// Reads exactly n bytes before the deadline: 1 done, 0 closed, −1 timed out.
int read_full(int fd, void* p, size_t n, Clock::time_point deadline) {
  char* c = static_cast<char*>(p);
  while (n) {
    const double left = seconds_left(deadline);
    if (left <= 0) return -1;
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, int(std::min(left * 1000.0, 1e9)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;
    const ssize_t got = ::recv(fd, c, n, 0);
    if (got == 0) return 0;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return 0;
    }
    c += got;
    n -= size_t(got);
  }
  return 1;
}

bool write_full(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= size_t(w);
  }
  return true;
}

sockaddr_in resolve(const TcpEndpoint& at) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(at.master_addr.c_str(), nullptr, &hints, &res) != 0 || !res)
    fail("--master-addr '", at.master_addr, "' does not resolve to an IPv4 address");
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  if (at.master_port <= 0 || at.master_port > 65535)
    fail("--master-port must be in 1..65535, got ", at.master_port);
  a.sin_port = htons(uint16_t(at.master_port));
  return a;
}

const char* op_name(uint32_t op) {
  switch (op) {
    case kAllReduce:
      return "all_reduce";
    case kAllGather:
      return "all_gather";
    case kAllToAllv:
      return "all_to_allv";
    case kBroadcast:
      return "broadcast";
    case kBarrier:
      return "barrier";
    case kAbort:
      return "abort";
    default:
      return "hello";
  }
}

}  // namespace

struct TcpCommunicator::Frame {
  uint32_t op = 0;
  std::vector<int64_t> aux;
  std::vector<char> data;
};

TcpCommunicator::TcpCommunicator(const TcpEndpoint& at, int rank, int world, double timeout_s)
    : rank_(rank), world_(world), timeout_s_(timeout_s) {
  if (world < 1 || rank < 0 || rank >= world)
    fail("rank ", rank, " is outside a world of ", world, " ranks");
  const sockaddr_in addr = resolve(at);
  const auto deadline = after(timeout_s);
  if (rank == 0) {
    peers_.assign(size_t(world), -1);
    if (world == 1) return;
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, world) != 0)
      fail("rank 0 cannot listen on ", at.master_addr, ":", at.master_port, " (",
           std::strerror(errno), "): pick another --master-port");
    for (int joined = 1; joined < world;) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      const double left = seconds_left(deadline);
      if (left <= 0 || ::poll(&pfd, 1, int(left * 1000.0) + 1) <= 0) {
        std::string missing;
        for (int r = 1; r < world; ++r)
          if (peers_[size_t(r)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        fail("rank 0: rank(s) ", missing, " did not connect to ", at.master_addr, ":",
             at.master_port, " within ", timeout_s, " s");
      }
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      int64_t hello[3];
      if (read_full(fd, hello, sizeof hello, deadline) != 1 || hello[0] != kMagic) {
        ::close(fd);  // not an osprey rank: ignore it
        continue;
      }
      const int r = int(hello[1]);
      if (hello[2] != world || r <= 0 || r >= world || peers_[size_t(r)] >= 0) {
        ::close(fd);
        fail("rank 0: a peer announced rank ", r, " of ", hello[2],
             " ranks; expected a new rank"
             " in 1..",
             world - 1, " of ", world, " (check --nnodes, --node-rank and the sizes)");
      }
      peers_[size_t(r)] = fd;
      ++joined;
    }
    return;
  }
  peers_.assign(1, -1);
  while (true) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const int64_t hello[3] = {kMagic, rank, world};
      if (!write_full(fd, hello, sizeof hello)) fail("rank ", rank, ": lost rank 0 while joining");
      peers_[0] = fd;
      return;
    }
    ::close(fd);
    if (seconds_left(deadline) <= 0)
      fail("rank ", rank, ": cannot reach rank 0 at ", at.master_addr, ":", at.master_port,
           " within ", timeout_s, " s (is the node with --node-rank 0 running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TcpCommunicator::~TcpCommunicator() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpCommunicator::send_frame(int fd, uint32_t op, const std::vector<int64_t>& aux,
                                 const void* data, size_t n) {
  const int64_t head[4] = {kMagic, op, int64_t(aux.size()), int64_t(n)};
  // A failed write shows up as a closed connection at the next read; nothing to do here.
  if (!write_full(fd, head, sizeof head)) return;
  if (!aux.empty() && !write_full(fd, aux.data(), aux.size() * sizeof(int64_t))) return;
  if (n) write_full(fd, data, n);
}

TcpCommunicator::Frame TcpCommunicator::recv_frame(int fd, int from, const char* op,
                                                   double timeout_s, double reported_s) {
  const auto deadline = after(timeout_s);
  auto lost = [&](int r) -> std::string {
    if (r < 0)
      return str_cat("rank(s) ", from, " did not reach ", op, " within ",
                     reported_s >= 0 ? reported_s : timeout_s, " s (rank ", rank_,
                     " waited; a rank hangs or died)");
    return str_cat("rank ", from, " closed its connection during ", op, " (it failed or exited)");
  };
  int64_t head[4];
  if (int r = read_full(fd, head, sizeof head, deadline); r != 1) throw CommError(lost(r));
  if (head[0] != kMagic || head[2] < 0 || head[3] < 0)
    throw CommError(str_cat("rank ", rank_, ": a corrupt frame from rank ", from));
  Frame f;
  f.op = uint32_t(head[1]);
  f.aux.resize(size_t(head[2]));
  f.data.resize(size_t(head[3]));
  if (!f.aux.empty())
    if (int r = read_full(fd, f.aux.data(), f.aux.size() * 8, deadline); r != 1)
      throw CommError(lost(r));
  if (!f.data.empty())
    if (int r = read_full(fd, f.data.data(), f.data.size(), deadline); r != 1)
      throw CommError(lost(r));
  return f;
}

void TcpCommunicator::hub_fail(const std::string& why) {
  failed_ = true;
  for (int r = 1; r < world_; ++r)
    if (peers_[size_t(r)] >= 0) send_frame(peers_[size_t(r)], kAbort, {}, why.data(), why.size());
  throw CommError(str_cat("rank 0: ", why));
}

std::vector<TcpCommunicator::Frame> TcpCommunicator::gather_frames(uint32_t op, const char* name) {
  if (failed_) throw CommError("rank 0: the communicator failed earlier");
  std::vector<Frame> frames(static_cast<size_t>(world_));
  const auto deadline = after(timeout_s_);
  for (int r = 1; r < world_; ++r) {
    try {
      frames[size_t(r)] = recv_frame(peers_[size_t(r)], r, name,
                                     std::max(seconds_left(deadline), 0.001), timeout_s_);
    } catch (const CommError& e) {
      hub_fail(e.what());
    }
    const Frame& f = frames[size_t(r)];
    if (f.op == kAbort)
      hub_fail(str_cat("rank ", r, " failed: ", std::string(f.data.begin(), f.data.end())));
    if (f.op != op)
      hub_fail(str_cat("rank ", r, " called ", op_name(f.op), " while rank 0 called ", name,
                       ": the ranks are out of step"));
  }
  return frames;
}

TcpCommunicator::Frame TcpCommunicator::await_reply(uint32_t op, const char* name) {
  if (failed_) throw CommError(str_cat("rank ", rank_, ": the communicator failed earlier"));
  Frame f;
  try {
    f = recv_frame(peers_[0], 0, name, timeout_s_ * kReplyGraceFactor + kReplyGraceS);
  } catch (const CommError& e) {
    failed_ = true;
    throw CommError(str_cat("rank ", rank_, ": ", e.what()));
  }
  if (f.op == kAbort) {
    failed_ = true;
    throw CommError(str_cat("rank ", rank_, ": ", std::string(f.data.begin(), f.data.end())));
  }
  OSPREY_CHECK(f.op == op, "reply ", op_name(f.op), " to ", name);
  return f;
}

void TcpCommunicator::all_reduce_sum(Tensor x) {
  OSPREY_CHECK(x.dtype == DType::F32 && x.device == Device::CPU, "all_reduce_sum: host F32");
  const size_t nb = x.nbytes();
  if (rank_ != 0) {
    send_frame(peers_[0], kAllReduce, {}, x.data, nb);
    Frame f = await_reply(kAllReduce, "all_reduce");
    std::memcpy(x.data, f.data.data(), nb);
    return;
  }
  std::vector<Frame> frames = gather_frames(kAllReduce, "all_reduce");
  std::vector<float> sum(x.f32(), x.f32() + x.numel());  // rank 0's part first: rank order
  for (int r = 1; r < world_; ++r) {
    if (frames[size_t(r)].data.size() != nb)
      hub_fail(str_cat("all_reduce: rank ", r, " has ", frames[size_t(r)].data.size() / 4,
                       " elements, rank 0 has ", x.numel()));
    const float* p = reinterpret_cast<const float*>(frames[size_t(r)].data.data());
    for (int64_t i = 0; i < x.numel(); ++i) sum[size_t(i)] += p[i];
  }
  std::memcpy(x.data, sum.data(), nb);
  for (int r = 1; r < world_; ++r) send_frame(peers_[size_t(r)], kAllReduce, {}, x.data, nb);
}

void TcpCommunicator::all_gather(Tensor out, Tensor in) {
  OSPREY_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * world_,
               "all_gather: out must hold size × in");
  const size_t nb = in.nbytes();
  if (rank_ != 0) {
    send_frame(peers_[0], kAllGather, {}, in.data, nb);
    Frame f = await_reply(kAllGather, "all_gather");
    std::memcpy(out.data, f.data.data(), out.nbytes());
    return;
  }
  std::vector<Frame> frames = gather_frames(kAllGather, "all_gather");
  char* o = static_cast<char*>(out.data);
  if (nb) std::memcpy(o, in.data, nb);
  for (int r = 1; r < world_; ++r) {
    if (frames[size_t(r)].data.size() != nb)
      hub_fail(str_cat("all_gather: rank ", r, " sends ", frames[size_t(r)].data.size(),
                       " bytes, rank 0 sends ", nb));
    if (nb) std::memcpy(o + size_t(r) * nb, frames[size_t(r)].data.data(), nb);
  }
  for (int r = 1; r < world_; ++r)
    send_frame(peers_[size_t(r)], kAllGather, {}, out.data, out.nbytes());
}

void TcpCommunicator::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                                  const std::vector<int64_t>& send_counts) {
  const int n = world_;
  OSPREY_CHECK(int(recv_counts.size()) == n && int(send_counts.size()) == n,
               "all_to_allv: one count per rank");
  const size_t es = dtype_size(in.dtype);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) sent += send_counts[size_t(r)], received += recv_counts[size_t(r)];
  OSPREY_CHECK(sent <= in.numel() && received <= out.numel(), "all_to_allv: counts exceed buffers");
  if (rank_ != 0) {
    std::vector<int64_t> aux = send_counts;
    aux.insert(aux.end(), recv_counts.begin(), recv_counts.end());
    send_frame(peers_[0], kAllToAllv, aux, in.data, size_t(sent) * es);
    Frame f = await_reply(kAllToAllv, "all_to_allv");
    if (f.data.size() != size_t(received) * es)
      throw CommError(str_cat("all_to_allv: rank ", rank_, " expected ", received,
                              " elements, got ", f.data.size() / es));
    if (!f.data.empty()) std::memcpy(out.data, f.data.data(), f.data.size());
    return;
  }
  std::vector<Frame> frames = gather_frames(kAllToAllv, "all_to_allv");
  // counts[i][j]: what rank i sends rank j; data[i]: rank i's send buffer.
  std::vector<std::vector<int64_t>> sends(static_cast<size_t>(n)), recvs(static_cast<size_t>(n));
  std::vector<const char*> data(static_cast<size_t>(n));
  sends[0] = send_counts;
  recvs[0] = recv_counts;
  data[0] = static_cast<const char*>(in.data);
  for (int r = 1; r < n; ++r) {
    const Frame& f = frames[size_t(r)];
    if (f.aux.size() != size_t(2 * n))
      hub_fail(str_cat("all_to_allv: rank ", r, " sent bad counts"));
    sends[size_t(r)].assign(f.aux.begin(), f.aux.begin() + n);
    recvs[size_t(r)].assign(f.aux.begin() + n, f.aux.end());
    data[size_t(r)] = f.data.data();
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (sends[size_t(i)][size_t(j)] != recvs[size_t(j)][size_t(i)])
        hub_fail(str_cat("all_to_allv: rank ", i, " sends ", sends[size_t(i)][size_t(j)],
                         " elements to rank ", j, ", which expects ", recvs[size_t(j)][size_t(i)]));
  for (int j = n - 1; j >= 0; --j) {  // rank 0's own part last: its `out` may alias nothing sent
    std::vector<char> part;
    for (int i = 0; i < n; ++i) {
      int64_t off = 0;
      for (int k = 0; k < j; ++k) off += sends[size_t(i)][size_t(k)];
      const char* p = data[size_t(i)] + size_t(off) * es;
      part.insert(part.end(), p, p + size_t(sends[size_t(i)][size_t(j)]) * es);
    }
    if (j == 0) {
      if (!part.empty()) std::memcpy(out.data, part.data(), part.size());
    } else {
      send_frame(peers_[size_t(j)], kAllToAllv, {}, part.data(), part.size());
    }
  }
}

void TcpCommunicator::broadcast(Tensor x, int root) {
  OSPREY_CHECK(root >= 0 && root < world_, "broadcast root ", root);
  const size_t nb = x.nbytes();
  if (rank_ != 0) {
    send_frame(peers_[0], kBroadcast, {root, int64_t(nb)}, x.data, rank_ == root ? nb : 0);
    Frame f = await_reply(kBroadcast, "broadcast");
    if (f.data.size() != nb)
      throw CommError(str_cat("broadcast: rank ", rank_, " expects ", nb, " bytes, the root sent ",
                              f.data.size()));
    if (rank_ != root && nb) std::memcpy(x.data, f.data.data(), nb);
    return;
  }
  std::vector<Frame> frames = gather_frames(kBroadcast, "broadcast");
  for (int r = 1; r < world_; ++r)
    if (frames[size_t(r)].aux.size() != 2 || frames[size_t(r)].aux[0] != root ||
        frames[size_t(r)].aux[1] != int64_t(nb))
      hub_fail(str_cat("broadcast: rank ", r, " disagrees with rank 0 on the root or the size"));
  if (root != 0) {
    const std::vector<char>& d = frames[size_t(root)].data;
    if (nb) std::memcpy(x.data, d.data(), nb);
  }
  for (int r = 1; r < world_; ++r) send_frame(peers_[size_t(r)], kBroadcast, {}, x.data, nb);
}

void TcpCommunicator::barrier() {
  if (rank_ != 0) {
    send_frame(peers_[0], kBarrier, {}, nullptr, 0);
    await_reply(kBarrier, "barrier");
    return;
  }
  gather_frames(kBarrier, "barrier");
  for (int r = 1; r < world_; ++r) send_frame(peers_[size_t(r)], kBarrier, {}, nullptr, 0);
}

void TcpCommunicator::abort(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  if (rank_ == 0) {
    const std::string m = str_cat("rank 0 failed: ", why);
    for (int r = 1; r < world_; ++r)
      if (peers_[size_t(r)] >= 0) send_frame(peers_[size_t(r)], kAbort, {}, m.data(), m.size());
  } else if (peers_[0] >= 0) {
    send_frame(peers_[0], kAbort, {}, why.data(), why.size());
  }
}

}  // namespace osprey::dist
