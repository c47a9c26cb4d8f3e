// See dynamic_map.h.
#include "model/quant/dynamic_map.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/error.h"

namespace shardlm::model::quant {

namespace {

// bitsandbytes 0.50.2's create_dynamic_map(signed=True / False) (max_exponent_bits=7, total_bits=8),
// as it computes them on x86-64 with AVX2 or AVX-512: for each exponent i the midpoints of
// torch.linspace(0.1, 1) scaled by 10^(i-6), both signs when signed, then 0 and 1, sorted. Written
// out rather than recomputed because torch.linspace rounds differently by instruction set (its scalar
// kernel changes a few codes), and saved 8-bit states must mean the same values on every machine.
// Printed by `tests/reference/make_adamw8bit_golden.py --print-maps`; the golden test compares them
// with bitsandbytes' own.
constexpr std::array<float, 256> kSignedMap = {
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f, -0x1.d86666p-1f,
    -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f, -0x1.a6p-1f,
    -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f, -0x1.7accccp-1f,
    -0x1.73999ap-1f, -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f, -0x1.4f999ap-1f,
    -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f, -0x1.246668p-1f,
    -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f, -0x1.f26664p-2f, -0x1.e4p-2f,
    -0x1.d59998p-2f, -0x1.c73334p-2f, -0x1.b8ccccp-2f, -0x1.aa6666p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f,
    -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f, -0x1.459998p-2f, -0x1.373334p-2f,
    -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f, -0x1.de6666p-3f, -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f, -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f,
    -0x1.b66668p-4f, -0x1.93d70ap-4f, -0x1.8851eep-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f,
    -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f, -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f,
    -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f, -0x1.b70a3ep-5f,
    -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f, -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f,
    -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f, -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451ebap-6f, -0x1.170a3ep-6f,
    -0x1.d1eb86p-7f, -0x1.75c29p-7f, -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f,
    -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f, -0x1.3126e8p-8f,
    -0x1.0c49bap-8f, -0x1.ced914p-9f, -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f, -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f,
    -0x1.19ce0ap-12f, -0x1.47ae16p-13f, -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0x0p+0f, 0x1.27476ep-21f, 0x1.b43528p-19f,
    0x1.040bfep-17f, 0x1.64840cp-16f, 0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f,
    0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f, 0x1.b3d07cp-11f,
    0x1.eecbfep-11f, 0x1.4fdf3ap-10f, 0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f,
    0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f,
    0x1.072b02p-7f, 0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f, 0x1.170a3ep-6f,
    0x1.451ebap-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f, 0x1.2ccccep-5f,
    0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f,
    0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f, 0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f,
    0x1.433334p-4f, 0x1.4eb854p-4f, 0x1.5a3d7p-4f, 0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f,
    0x1.93d70ap-4f, 0x1.b66668p-4f, 0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3334p-3f,
    0x1.88p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f, 0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626666p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f,
    0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f, 0x1.d59998p-2f, 0x1.e4p-2f,
    0x1.f26664p-2f, 0x1.006666p-1f, 0x1.079998p-1f, 0x1.0eccccp-1f, 0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246668p-1f,
    0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f, 0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f,
    0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f, 0x1.73999ap-1f, 0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f,
    0x1.906666p-1f, 0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f, 0x1.bb999ap-1f,
    0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f, 0x1.eep-1f,
    0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f,
};
constexpr std::array<float, 256> kUnsignedMap = {
    0x0p+0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f, 0x1.2599ecp-18f, 0x1.bc98a2p-18f, 0x1.29cbaap-17f,
    0x1.0624dcp-16f, 0x1.c2e34p-16f, 0x1.3fd0dp-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f, 0x1.2d7732p-14f,
    0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f, 0x1.82a994p-13f, 0x1.f8a092p-13f, 0x1.374bc8p-12f,
    0x1.724744p-12f, 0x1.ad42c6p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f, 0x1.4c986p-11f,
    0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f, 0x1.c28f5ep-11f, 0x1.e00d1cp-11f, 0x1.fd8adcp-11f,
    0x1.2b020cp-10f, 0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041894p-9f, 0x1.28f5c2p-9f, 0x1.4dd2fp-9f, 0x1.72b02p-9f,
    0x1.978d4ep-9f, 0x1.bc6a8p-9f, 0x1.e147aep-9f, 0x1.03126ep-8f, 0x1.158104p-8f, 0x1.27ef9ep-8f, 0x1.3a5e34p-8f,
    0x1.4cccccp-8f, 0x1.5f3b64p-8f, 0x1.71a9fap-8f, 0x1.841894p-8f, 0x1.96872ap-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f,
    0x1.cdd2fp-8f, 0x1.e0418ap-8f, 0x1.f2b01ep-8f, 0x1.028f5cp-7f, 0x1.0bc6a8p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f,
    0x1.276c8ap-7f, 0x1.30a3d6p-7f, 0x1.39db24p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f, 0x1.8ccccep-7f, 0x1.bae146p-7f,
    0x1.e8f5c4p-7f, 0x1.0b851ep-6f, 0x1.228f5ep-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f, 0x1.7eb852p-6f,
    0x1.95c28ep-6f, 0x1.accccep-6f, 0x1.c3d70ep-6f, 0x1.dae146p-6f, 0x1.f1eb86p-6f, 0x1.047aep-5f, 0x1.1p-5f,
    0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f, 0x1.49999ap-5f, 0x1.551eb8p-5f, 0x1.60a3d6p-5f,
    0x1.6c28f6p-5f, 0x1.77ae14p-5f, 0x1.833334p-5f, 0x1.8eb85p-5f, 0x1.9a3d7p-5f, 0x1.a5c28ep-5f, 0x1.b147aep-5f,
    0x1.bccccep-5f, 0x1.c851eep-5f, 0x1.d3d70ep-5f, 0x1.df5c2ap-5f, 0x1.eae146p-5f, 0x1.f66666p-5f, 0x1.00f5c4p-4f,
    0x1.06b854p-4f, 0x1.0c7ae2p-4f, 0x1.123d7p-4f, 0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23852p-4f, 0x1.2947aep-4f,
    0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f, 0x1.46147cp-4f, 0x1.4bd70ap-4f, 0x1.51999ap-4f,
    0x1.575c2ap-4f, 0x1.5d1eb8p-4f, 0x1.62e148p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f, 0x1.7428f6p-4f, 0x1.79eb86p-4f,
    0x1.7fae16p-4f, 0x1.8570a4p-4f, 0x1.8b3334p-4f, 0x1.90f5c4p-4f, 0x1.96b852p-4f, 0x1.a8p-4f, 0x1.c4ccccp-4f,
    0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f, 0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f,
    0x1.559998p-3f, 0x1.64p-3f, 0x1.726668p-3f, 0x1.80ccccp-3f, 0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f,
    0x1.ba6668p-3f, 0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e59998p-3f, 0x1.f4p-3f, 0x1.013332p-2f, 0x1.086666p-2f,
    0x1.0f999ap-2f, 0x1.16ccccp-2f, 0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6666p-2f, 0x1.339998p-2f, 0x1.3accccp-2f,
    0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f, 0x1.579998p-2f, 0x1.5eccccp-2f, 0x1.66p-2f, 0x1.6d3334p-2f,
    0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f, 0x1.913334p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f,
    0x1.a6ccccp-2f, 0x1.aep-2f, 0x1.b53334p-2f, 0x1.bc6666p-2f, 0x1.c39998p-2f, 0x1.caccccp-2f, 0x1.d2p-2f,
    0x1.d93334p-2f, 0x1.e06666p-2f, 0x1.e79998p-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f, 0x1.023334p-1f,
    0x1.05ccccp-1f, 0x1.096666p-1f, 0x1.0dp-1f, 0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
    0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f, 0x1.2d6668p-1f, 0x1.31p-1f, 0x1.34999ap-1f,
    0x1.383334p-1f, 0x1.3bccccp-1f, 0x1.3f6668p-1f, 0x1.43p-1f, 0x1.46999ap-1f, 0x1.4a3334p-1f, 0x1.4dccccp-1f,
    0x1.516668p-1f, 0x1.55p-1f, 0x1.58999ap-1f, 0x1.5c3334p-1f, 0x1.5fccccp-1f, 0x1.636668p-1f, 0x1.67p-1f,
    0x1.6a999ap-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f, 0x1.756668p-1f, 0x1.79p-1f, 0x1.7c999ap-1f, 0x1.803334p-1f,
    0x1.83ccccp-1f, 0x1.876668p-1f, 0x1.8bp-1f, 0x1.8e9998p-1f, 0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996668p-1f,
    0x1.9dp-1f, 0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f, 0x1.afp-1f, 0x1.b29998p-1f,
    0x1.b63334p-1f, 0x1.b9ccccp-1f, 0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c49998p-1f, 0x1.c83334p-1f, 0x1.cbccccp-1f,
    0x1.cf6668p-1f, 0x1.d3p-1f, 0x1.d69998p-1f, 0x1.da3334p-1f, 0x1.ddccccp-1f, 0x1.e16668p-1f, 0x1.e5p-1f,
    0x1.e89998p-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f, 0x1.f7p-1f, 0x1.fa9998p-1f, 0x1.fe3334p-1f,
    0x1p+0f,
};
// bitsandbytes' build_quantize_lut: entry i holds the index of the first midpoint that is not below
// the grid point -1 + 2i / 65535 (float32 arithmetic, as its source writes it).
std::vector<uint8_t> make_lut(const std::array<float, 256>& code) {
  float mid[255];
  for (int i = 0; i < 255; ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
  std::vector<uint8_t> lut(65536);
  int c = 0;
  for (int i = 0; i < 65536; ++i) {
    const float val = -1.0f + (2.0f * static_cast<float>(i)) / 65535.0f;
    while (c < 255 && mid[c] < val) ++c;
    lut[i] = static_cast<uint8_t>(c);
  }
  return lut;
}

// bitsandbytes' norm_to_lut_index. This file is compiled with -ffp-contract=off (CMakeLists.txt):
// bitsandbytes rounds the product and the sum separately on x86-64.
inline uint16_t lut_index(float v) {
  v = std::clamp(v, -1.0f, 1.0f);
  return static_cast<uint16_t>((v + 1.0f) * 0.5f * 65535.0f + 0.5f);
}

}  // namespace

const std::array<float, 256>& dynamic_map(bool is_signed) { return is_signed ? kSignedMap : kUnsignedMap; }

std::pair<at::Tensor, at::Tensor> quantize_blockwise_cpu(const at::Tensor& values, int64_t blocksize) {
  if (blocksize <= 0) fail("quantize_blockwise_cpu: blocksize must be positive, got ", blocksize);
  static const std::vector<uint8_t> lut = make_lut(kSignedMap);
  const auto v = values.to(at::kCPU, at::kFloat).contiguous().view({-1});
  const int64_t n = v.numel(), nb = (n + blocksize - 1) / blocksize;
  auto codes = at::empty({n}, at::kByte);
  auto absmax = at::empty({nb}, at::kFloat);
  const float* x = v.data_ptr<float>();
  uint8_t* q = codes.data_ptr<uint8_t>();
  float* a = absmax.data_ptr<float>();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * blocksize, hi = std::min(n, lo + blocksize);
    float m = 0.0f;
    for (int64_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(x[i]));
    a[b] = m;
    if (m == 0.0f) {
      std::fill(q + lo, q + hi, uint8_t{0});
      continue;
    }
    const float inv = 1.0f / m;
    for (int64_t i = lo; i < hi; ++i) q[i] = lut[lut_index(x[i] * inv)];
  }
  return {codes.view(values.sizes()), absmax};
}

at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize) {
  const auto c = codes.to(at::kCPU).contiguous().view({-1});
  const auto a = absmax.to(at::kCPU, at::kFloat).contiguous();
  const int64_t n = c.numel();
  if (blocksize <= 0 || a.numel() != (n + blocksize - 1) / blocksize)
    fail("dequantize_blockwise: ", a.numel(), " absmax values for ", n, " codes in blocks of ", blocksize);
  auto out = at::empty({n}, at::kFloat);
  const uint8_t* q = c.data_ptr<uint8_t>();
  const float* ap = a.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) o[i] = kSignedMap[q[i]] * ap[i / blocksize];
  return out.view(codes.sizes()).to(codes.device());
}

}  // namespace shardlm::model::quant
