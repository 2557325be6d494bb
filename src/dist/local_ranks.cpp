#include "dist/local_ranks.h"

#include <exception>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/tcp_comm.h"
#include "dist/thread_comm.h"

namespace osprey::dist {

std::vector<std::unique_ptr<Communicator>> make_local_control_ranks(const ParallelConfig& p,
                                                                    Device device) {
  const int world = p.world_size(), local = p.ranks_per_node(), first = p.first_local_rank();
  if (p.nnodes == 1 && device == Device::CPU) return make_thread_group(world);
  std::vector<std::unique_ptr<Communicator>> ranks(static_cast<size_t>(local));
  std::vector<std::string> errs(static_cast<size_t>(local));
  std::vector<std::thread> ts;
  for (int i = 0; i < local; ++i)
    ts.emplace_back([&, i] {
      try {
        ranks[size_t(i)] = std::make_unique<TcpCommunicator>(
            TcpEndpoint{p.master_addr, p.master_port}, first + i, world);
      } catch (const std::exception& e) {
        errs[size_t(i)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errs)
    if (!e.empty()) fail(e);
  return ranks;
}

}  // namespace osprey::dist
