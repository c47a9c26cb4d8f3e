// See host_optimizer.h.
#include "parallel/zero/host_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <utility>

#include "optim/quantized_state.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

// A CPU device: the "device" tensors are host tensors, every copy happens when it is asked for.
class SyncTransfers : public OffloadTransfers {
 public:
  bool pinned() const override { return false; }
  void begin() override {}
  void to_host(size_t, const at::Tensor& host, const at::Tensor& device) override { host.copy_(device); }
  void grads_queued(size_t) override {}
  void wait_grads(size_t) override {}
  void to_device(size_t, const at::Tensor& device, const at::Tensor& host) override { device.copy_(host); }
  void finish() override {}
};

// A GPU: gradients come down on one side stream, parameters go up on another, so a copy-back never
// queues behind the next chunk's gradient; both start after the work queued on the compute stream.
class CudaTransfers : public OffloadTransfers {
 public:
  explicit CudaTransfers(c10::Device device)
      : device_(device),
        d2h_(c10::cuda::getStreamFromPool(false, device.index())),
        h2d_(c10::cuda::getStreamFromPool(false, device.index())) {}
  bool pinned() const override { return true; }
  void begin() override {
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(d2h_);
    ready.block(h2d_);
    grads_.clear();
  }
  void to_host(size_t, const at::Tensor& host, const at::Tensor& device) override {
    const c10::cuda::CUDAStreamGuard on(d2h_);
    host.copy_(device, /*non_blocking=*/true);
  }
  void grads_queued(size_t chunk) override {
    if (grads_.size() <= chunk) grads_.resize(chunk + 1);
    grads_[chunk] = std::make_unique<at::cuda::CUDAEvent>();
    grads_[chunk]->record(d2h_);
  }
  void wait_grads(size_t chunk) override { grads_.at(chunk)->synchronize(); }
  void to_device(size_t, const at::Tensor& device, const at::Tensor& host) override {
    const c10::cuda::CUDAStreamGuard on(h2d_);
    device.copy_(host, /*non_blocking=*/true);
  }
  void finish() override {
    at::cuda::CUDAEvent done;
    done.record(h2d_);
    done.block(c10::cuda::getCurrentCUDAStream(device_.index()));
    done.synchronize();
  }

 private:
  c10::Device device_;
  c10::cuda::CUDAStream d2h_, h2d_;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> grads_;
};

}  // namespace

at::Tensor host_buffer(int64_t n, at::ScalarType dtype, bool pinned) {
  return at::empty({n}, at::TensorOptions().dtype(dtype).pinned_memory(pinned));
}

std::unique_ptr<OffloadTransfers> make_offload_transfers(c10::Device device) {
  if (device.is_cuda()) return std::make_unique<CudaTransfers>(device);
  return std::make_unique<SyncTransfers>();
}

namespace {
void refuse_lamb(const optim::AdamWOptions& options) {
  if (options.rule == optim::UpdateRule::Lamb)
    fail("zero_optimization.offload_optimizer.device \"cpu\" steps the shard in pieces, which Lamb's trust ratio "
         "cannot do; use optimizer.type AdamW/Adam, or offload_optimizer.device \"none\"");
}
void check_numel(const HostShard& s, int64_t n) {
  if (s.device_param.numel() != n || s.device_grad.numel() != n)
    fail("internal: host optimizer segment ", s.segment.name, " has ", n, " master elements but its device parameter ",
         s.device_param.numel(), " and gradient ", s.device_grad.numel());
}
bool same_memory(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.scalar_type() == b.scalar_type() && a.numel() == b.numel();
}
}  // namespace

HostOptimizer::HostOptimizer(std::vector<HostShard> shards, optim::AdamWOptions options,
                             std::unique_ptr<OffloadTransfers> transfers, HostOptimizerOptions opts)
    : shards_(std::move(shards)) {
  refuse_lamb(options);
  const bool pinned = transfers->pinned();
  std::vector<optim::Segment> segments;
  for (auto& s : shards_) {
    const int64_t n = s.segment.param.numel();
    check_numel(s, n);
    // fp32 masters, or bf16 ones (optimizer.master_precision, optim/master_format.h).
    const auto master_dtype = options.masters == optim::MasterRounding::None ? at::kFloat : at::kBFloat16;
    master_.push_back(host_buffer(n, master_dtype, pinned));
    master_.back().copy_(s.segment.param.reshape({-1}));
    grad_.push_back(host_buffer(n, s.device_grad.scalar_type(), pinned));
    grad_.back().zero_();
    optim::Segment seg = s.segment;
    seg.param = master_.back();
    seg.grad = grad_.back();
    segments.push_back(std::move(seg));
    s.segment.param = at::Tensor();  // the caller's (device) master is no longer referenced here
  }
  own_adam_ = std::make_unique<optim::AdamW>(std::move(segments), options);
  adam_ = own_adam_.get();
  plan_chunks(opts, std::move(transfers));
}

HostOptimizer::HostOptimizer(optim::AdamW& adam, std::vector<HostShard> shards,
                             std::unique_ptr<OffloadTransfers> transfers, HostOptimizerOptions opts)
    : shards_(std::move(shards)), adam_(&adam) {
  refuse_lamb(adam.options());
  const auto& segments = adam.segments();
  if (segments.size() != shards_.size())
    fail("internal: host optimizer given ", shards_.size(), " shards for ", segments.size(), " optimizer segments");
  for (size_t i = 0; i < shards_.size(); ++i) {
    check_numel(shards_[i], segments[i].param.numel());
    master_.push_back(segments[i].param);
    grad_.push_back(segments[i].grad);
    shards_[i].segment.param = at::Tensor();
  }
  plan_chunks(opts, std::move(transfers));
}

void HostOptimizer::plan_chunks(const HostOptimizerOptions& opts, std::unique_ptr<OffloadTransfers> transfers) {
  const bool pinned = transfers->pinned();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const auto& s = shards_[i];
    const auto& dp = s.device_param;
    if (dp.scalar_type() == master_[i].scalar_type()) stage_.push_back(master_[i]);
    else if (s.host_stage.defined()) stage_.push_back(s.host_stage);
    else stage_.push_back(host_buffer(dp.numel(), dp.scalar_type(), pinned));
    if (stage_[i].numel() != dp.numel() || stage_[i].scalar_type() != dp.scalar_type())
      fail("internal: host optimizer segment ", s.segment.name, " was given a staging buffer of ", stage_[i].numel(),
           " elements for a device parameter of ", dp.numel());
  }
  // Pieces of at most piece_elements, cut where a chunk fills; 8-bit pieces on quantization blocks
  // of their parameter (step_pieces needs it), others on multiples of 64 elements.
  const int64_t chunk_elements = std::max<int64_t>(opts.chunk_elements, 4 * optim::kQuantBlock);
  const int64_t piece_elements = std::clamp<int64_t>(opts.piece_elements, optim::kQuantBlock, chunk_elements);
  std::vector<std::vector<OffloadPiece>> chunks;
  std::vector<OffloadPiece> cur;
  int64_t used = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const int64_t n = master_[i].numel();
    const bool int8 = adam_->format(i) == optim::StatePrecision::Int8;
    int64_t pos = 0;
    while (pos < n) {
      int64_t take = std::min({n - pos, piece_elements, chunk_elements - used});
      if (take < n - pos) take -= int8 ? (shards_[i].segment.param_offset + pos + take) % optim::kQuantBlock : take % 64;
      if (take <= 0) {
        chunks.push_back(std::move(cur));
        cur.clear();
        used = 0;
        continue;
      }
      cur.push_back({i, pos, take});
      pos += take;
      used += take;
    }
  }
  if (!cur.empty()) chunks.push_back(std::move(cur));
  moves_ = std::make_unique<ChunkTransfers>(shards_, grad_, stage_, std::move(transfers), std::move(chunks));
}

int64_t HostOptimizer::staging_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < master_.size(); ++i) {
    b += static_cast<int64_t>(grad_[i].nbytes());
    if (!stage_[i].is_same(master_[i])) b += static_cast<int64_t>(stage_[i].nbytes());
  }
  return b;
}

std::string HostOptimizer::describe() const {
  const std::string where =
      !moves_->copies() ? "masters and moments in host memory, used in place (a CPU run: the device is the host)"
      : moves_->pinned()
          ? "masters and moments in host memory, gradients copied down and parameters up through pinned buffers, "
            "asynchronously on side streams"
          : "masters and moments in host buffers apart from the device's, copied synchronously (the GPU layout on "
            "a CPU run)";
  return "optimizer step on the host (offload_optimizer cpu): " + where + "; " + std::to_string(chunks()) +
         " chunks, " + std::to_string(at::get_num_threads()) + " thread(s)";
}

int64_t HostOptimizer::host_bytes() const {
  int64_t b = adam_->state_bytes() + staging_bytes();
  for (const auto& m : master_) b += static_cast<int64_t>(m.nbytes());
  return b;
}

void HostOptimizer::step(double lr, const std::vector<double>* grad_multipliers) {
  at::NoGradGuard no_grad;
  auto& adam = *adam_;
  auto piece_of = [&](const OffloadPiece& p) {
    optim::AdamW::Piece a = adam.resident_piece(p.segment);
    const int64_t off = shards_[p.segment].segment.param_offset;
    a.begin = p.begin;
    a.numel = p.numel;
    a.param = a.param.narrow(0, p.begin, p.numel);
    a.exp_avg = a.exp_avg.view({-1}).narrow(0, p.begin, p.numel);
    a.exp_avg_sq = a.exp_avg_sq.view({-1}).narrow(0, p.begin, p.numel);
    // Kahan's compensation is per element, like the moments: the piece's elements, never the whole buffer.
    if (a.compensation.defined()) a.compensation = a.compensation.view({-1}).narrow(0, p.begin, p.numel);
    if (a.absmax1.defined()) {
      const int64_t first = optim::first_block(off + p.begin) - optim::first_block(off);
      const int64_t blocks = optim::blocks_touched(off + p.begin, p.numel);
      a.absmax1 = a.absmax1.narrow(0, first, blocks);
      a.absmax2 = a.absmax2.narrow(0, first, blocks);
    }
    return a;
  };
  const auto& chunks = moves_->chunks();
  std::vector<std::vector<optim::AdamW::Piece>> pieces(chunks.size());
  bool shared = false;
  for (size_t k = 0; k < chunks.size(); ++k)
    for (const OffloadPiece& p : chunks[k]) {
      pieces[k].push_back(piece_of(p));
      shared = shared || adam.shares_blocks(pieces[k].back());
    }
  adam.begin_step();
  // 8-bit blocks cut by a shard boundary: every rank needs the block maxima before any piece steps,
  // so all gradients come down first (no overlap for this step's gradient copies).
  moves_->begin(shared);
  if (shared) {
    std::vector<optim::AdamW::Piece> all;
    for (const auto& c : pieces) all.insert(all.end(), c.begin(), c.end());
    adam.collect_shared_maxima(all, grad_multipliers);
    adam.reduce_shared_maxima();
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    moves_->gradients(k);
    const auto& ps = pieces[k];
    at::parallel_for(0, static_cast<int64_t>(ps.size()), 1, [&](int64_t b, int64_t e) {
      adam.step_pieces(lr, grad_multipliers, std::vector<optim::AdamW::Piece>(ps.begin() + b, ps.begin() + e));
      for (int64_t j = b; j < e; ++j)  // cast to the device's dtype here, on this worker
        moves_->cast(chunks[k][static_cast<size_t>(j)], ps[static_cast<size_t>(j)].param);
    });
    for (const OffloadPiece& p : chunks[k]) moves_->send(k, p);  // goes up while chunk k+1 steps
  }
  moves_->finish();
}

ChunkTransfers::ChunkTransfers(std::vector<HostShard> shards, std::vector<at::Tensor> host_grads,
                               std::vector<at::Tensor> stages, std::unique_ptr<OffloadTransfers> transfers,
                               std::vector<std::vector<OffloadPiece>> chunks)
    : shards_(std::move(shards)), grad_(std::move(host_grads)), stage_(std::move(stages)),
      transfers_(std::move(transfers)), chunks_(std::move(chunks)) {
  if (grad_.size() != shards_.size() || stage_.size() != shards_.size())
    fail("internal: chunk transfers given ", shards_.size(), " shards, ", grad_.size(), " gradient and ",
         stage_.size(), " staging buffers");
  for (size_t i = 0; i < shards_.size(); ++i) {
    shards_[i].segment.param = at::Tensor();
    apart_ = apart_ || !same_memory(grad_[i], shards_[i].device_grad);
  }
}

void ChunkTransfers::queue(size_t k) {
  for (const OffloadPiece& p : chunks_[k])
    if (!same_memory(grad_[p.segment], shards_[p.segment].device_grad))
      transfers_->to_host(k, grad_[p.segment].narrow(0, p.begin, p.numel),
                          shards_[p.segment].device_grad.narrow(0, p.begin, p.numel));
  transfers_->grads_queued(k);
  queued_ = k + 1;
}

void ChunkTransfers::begin(bool all_first) {
  transfers_->begin();
  queued_ = 0;
  if (all_first) {
    for (size_t k = 0; k < chunks_.size(); ++k) queue(k);
    for (size_t k = 0; k < chunks_.size(); ++k) transfers_->wait_grads(k);
  } else if (!chunks_.empty()) {
    queue(0);
  }
}

void ChunkTransfers::gradients(size_t k) {
  if (queued_ == k + 1 && k + 1 < chunks_.size()) queue(k + 1);  // lands while chunk k steps
  transfers_->wait_grads(k);
}

void ChunkTransfers::cast(const OffloadPiece& p, const at::Tensor& master) const {
  const auto dst = stage_[p.segment].narrow(0, p.begin, p.numel);
  if (!same_memory(dst, master)) dst.copy_(master);
}

void ChunkTransfers::send(size_t k, const OffloadPiece& p) {
  transfers_->to_device(k, shards_[p.segment].device_param.narrow(0, p.begin, p.numel),
                        stage_[p.segment].narrow(0, p.begin, p.numel));
}

void ChunkTransfers::finish() { transfers_->finish(); }

std::string ChunkTransfers::describe() const {
  return "per chunk, gradients copied down and parameters up through " +
         std::string(pinned() ? "pinned host buffers, asynchronously on side streams"
                              : "host buffers apart from the device's, synchronously (the GPU layout on a CPU run)");
}

}  // namespace shardlm::parallel
