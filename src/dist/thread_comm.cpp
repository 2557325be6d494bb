#include "dist/thread_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace osprey::dist {

// What one rank posts for a collective.
struct Post {
  const char* op = "";
  void* out = nullptr;
  const void* in = nullptr;
  int64_t n = 0;  // elements of `in` (all_to_allv: total sent)
  DType dtype = DType::F32;
  // Copies (not pointers): a peer that throws on a mismatch must not leave them dangling for a
  // rank still checking them.
  std::vector<int64_t> send_counts, recv_counts;
  int root = 0;
};

class ThreadGroup {
 public:
  ThreadGroup(int n, double timeout_s)
      : n_(n), timeout_s_(timeout_s), posts_(size_t(n)), arrived_(size_t(n), 0) {}
  int size() const { return n_; }

  // A cyclic barrier: returns once all n ranks arrived at this phase; throws CommError when a rank
  // aborted or the timeout passed (naming the ranks that did not arrive).
  void arrive(int rank, const char* op) {
    std::unique_lock<std::mutex> lk(mu_);
    throw_if_failed(rank);
    const uint64_t gen = generation_;
    arrived_[size_t(rank)] = 1;
    if (++count_ == n_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), 0);
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s_));
    while (generation_ == gen && failed_.empty()) {
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && generation_ == gen &&
          failed_.empty()) {
        std::string missing;
        for (int r = 0; r < n_; ++r)
          if (!arrived_[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        failed_ = str_cat("rank(s) ", missing, " did not reach ", op, " within ", timeout_s_,
                          " s (rank ", rank, " waited; a rank hangs or died)");
        cv_.notify_all();
      }
    }
    if (generation_ == gen) throw_if_failed(rank);
  }

  void abort(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_.empty()) failed_ = str_cat("rank ", rank, " failed: ", why);
    cv_.notify_all();
  }

  Post& post(int r) { return posts_[size_t(r)]; }

 private:
  void throw_if_failed(int rank) {
    if (!failed_.empty()) throw CommError(str_cat("rank ", rank, ": ", failed_));
  }

  const int n_;
  const double timeout_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int count_ = 0;
  std::vector<Post> posts_;
  std::vector<char> arrived_;
  std::string failed_;
};

namespace {

void check_host_contiguous(const Tensor& t, const char* op) {
  if (t.numel() > 0 && t.device != Device::CPU)
    throw CommError(str_cat(op, ": the CPU communicator needs host buffers"));
}

// All ranks posted `me`'s kind of collective with compatible arguments, or every rank throws.
void check_same(ThreadGroup& g, int me) {
  const Post& p = g.post(me);
  for (int r = 0; r < g.size(); ++r) {
    const Post& q = g.post(r);
    if (std::strcmp(q.op, p.op) != 0)
      throw CommError(str_cat("rank ", me, " called ", p.op, " while rank ", r, " called ", q.op,
                              ": the ranks are out of step"));
    if (q.dtype != p.dtype)
      throw CommError(str_cat(p.op, ": rank ", r, " has ", dtype_name(q.dtype), ", rank ", me,
                              " has ", dtype_name(p.dtype)));
  }
}

}  // namespace

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

int ThreadCommunicator::size() const {
  return group_->size();
}

void ThreadCommunicator::all_reduce_sum(Tensor x) {
  check_host_contiguous(x, "all_reduce");
  OSPREY_CHECK(x.dtype == DType::F32, "all_reduce_sum takes F32, got ", dtype_name(x.dtype));
  ThreadGroup& g = *group_;
  g.post(rank_) = Post{"all_reduce", x.data, x.data, x.numel(), x.dtype, {}, {}, 0};
  g.arrive(rank_, "all_reduce");
  check_same(g, rank_);
  for (int r = 0; r < g.size(); ++r)
    if (g.post(r).n != x.numel())
      throw CommError(str_cat("all_reduce: rank ", r, " has ", g.post(r).n, " elements, rank ",
                              rank_, " has ", x.numel()));
  // Every rank sums in rank order 0..n−1: identical results everywhere.
  std::vector<float> sum(size_t(x.numel()), 0.0f);  // [numel]
  for (int r = 0; r < g.size(); ++r) {
    const float* p = static_cast<const float*>(g.post(r).in);
    for (int64_t i = 0; i < x.numel(); ++i) sum[size_t(i)] += p[i];
  }
  g.arrive(rank_, "all_reduce (read)");
  std::copy(sum.begin(), sum.end(), x.f32());
}

void ThreadCommunicator::all_gather(Tensor out, Tensor in) {
  check_host_contiguous(out, "all_gather");
  check_host_contiguous(in, "all_gather");
  OSPREY_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * size(),
               "all_gather: out must hold size × in");
  ThreadGroup& g = *group_;
  g.post(rank_) = Post{"all_gather", out.data, in.data, in.numel(), in.dtype, {}, {}, 0};
  g.arrive(rank_, "all_gather");
  check_same(g, rank_);
  const size_t es = dtype_size(in.dtype), nb = size_t(in.numel()) * es;
  // Every rank checks every post before any reads: all throw together or none, so no rank
  // reads a buffer whose owner has already unwound.
  for (int r = 0; r < g.size(); ++r)
    if (g.post(r).n != in.numel())
      throw CommError(str_cat("all_gather: rank ", r, " sends ", g.post(r).n, " elements, rank ",
                              rank_, " sends ", in.numel()));
  for (int r = 0; r < g.size(); ++r)
    if (nb) std::memcpy(static_cast<char*>(out.data) + size_t(r) * nb, g.post(r).in, nb);
  g.arrive(rank_, "all_gather (read)");
}

void ThreadCommunicator::all_to_allv(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                                     const std::vector<int64_t>& send_counts) {
  check_host_contiguous(out, "all_to_allv");
  check_host_contiguous(in, "all_to_allv");
  const int n = size();
  OSPREY_CHECK(int(recv_counts.size()) == n && int(send_counts.size()) == n,
               "all_to_allv: one count per rank");
  int64_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) sent += send_counts[size_t(r)], received += recv_counts[size_t(r)];
  OSPREY_CHECK(sent <= in.numel() && received <= out.numel(), "all_to_allv: counts exceed buffers");
  ThreadGroup& g = *group_;
  g.post(rank_) =
      Post{"all_to_allv", out.data, in.data, sent, in.dtype, send_counts, recv_counts, 0};
  g.arrive(rank_, "all_to_allv");
  check_same(g, rank_);
  // The whole count matrix checked by every rank before any reads (see all_gather).
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int64_t sent_ij = g.post(i).send_counts[size_t(j)];
      const int64_t expected = g.post(j).recv_counts[size_t(i)];
      if (sent_ij != expected)
        throw CommError(str_cat("all_to_allv: rank ", i, " sends ", sent_ij, " elements to rank ",
                                j, ", which expects ", expected));
    }
  const size_t es = dtype_size(in.dtype);
  char* dst = static_cast<char*>(out.data);
  for (int r = 0; r < n; ++r) {
    const Post& p = g.post(r);
    const int64_t c = p.send_counts[size_t(rank_)];
    int64_t off = 0;  // where rank r's segment for me starts in its `in`
    for (int j = 0; j < rank_; ++j) off += p.send_counts[size_t(j)];
    if (c) std::memcpy(dst, static_cast<const char*>(p.in) + size_t(off) * es, size_t(c) * es);
    dst += size_t(c) * es;
  }
  g.arrive(rank_, "all_to_allv (read)");
}

void ThreadCommunicator::broadcast(Tensor x, int root) {
  check_host_contiguous(x, "broadcast");
  OSPREY_CHECK(root >= 0 && root < size(), "broadcast root ", root);
  ThreadGroup& g = *group_;
  g.post(rank_) = Post{"broadcast", x.data, x.data, x.numel(), x.dtype, {}, {}, root};
  g.arrive(rank_, "broadcast");
  check_same(g, rank_);
  const Post& p = g.post(root);
  if (g.post(rank_).root != root || p.root != root)
    throw CommError(str_cat("broadcast: ranks disagree on the root"));
  if (p.n != x.numel())
    throw CommError(str_cat("broadcast: root ", root, " sends ", p.n, " elements, rank ", rank_,
                            " expects ", x.numel()));
  if (rank_ != root && x.nbytes()) std::memcpy(x.data, p.in, x.nbytes());
  g.arrive(rank_, "broadcast (read)");
}

void ThreadCommunicator::barrier() {
  group_->post(rank_) = Post{"barrier", nullptr, nullptr, 0, DType::F32, {}, {}, 0};
  group_->arrive(rank_, "barrier");
  check_same(*group_, rank_);
  group_->arrive(rank_, "barrier (2)");
}

void ThreadCommunicator::abort(const std::string& why) {
  group_->abort(rank_, why);
}

std::vector<std::unique_ptr<Communicator>> make_thread_group(int n, double timeout_s) {
  if (n < 1) fail("a communicator needs at least one rank, got ", n);
  auto g = std::make_shared<ThreadGroup>(n, timeout_s);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadCommunicator>(g, r));
  return out;
}

}  // namespace osprey::dist
